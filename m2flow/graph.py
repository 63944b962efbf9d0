"""The macro graph: workers as nodes, loop / then / sync edges between their ports, validated.

Every problem found is reported at once, each naming the key in the workflow file and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from m2flow.contract import Agreed, WorkerInfo, describe_worker
from m2flow.dispatch import gather, shards_needed, state_only
from m2flow.errors import SpecError, did_you_mean
from m2flow.resolve import resolve
from m2flow.spec import MAX_REPLICAS, Edge, PortRef, SyncSpec, WorkflowSpec


@dataclass(frozen=True)
class LoopChain:
    """The interaction loop as a chain of ports p0 -> p1 -> ... -> pk.

    p0 is read once at the start of an iteration; then, `horizon` times, p1..pk run in order and
    pk's output feeds p1 again (for `env.obs -> policy.act -> env.step`: obs once, then act, step).
    """

    ports: tuple[PortRef, ...]
    horizon: int

    @property
    def entry(self) -> PortRef:
        return self.ports[0]

    @property
    def body(self) -> tuple[PortRef, ...]:
        return self.ports[1:]

    @property
    def workers(self) -> list[str]:
        return list(dict.fromkeys(p.worker for p in self.ports))


@dataclass
class MacroGraph:
    spec: WorkflowSpec
    graph: nx.MultiDiGraph
    loop: LoopChain | None
    then: list[Edge]
    then_order: list[PortRef]
    sync: list[SyncSpec]
    info: dict[str, WorkerInfo] = field(default_factory=dict)

    @property
    def workers(self) -> dict:
        return self.spec.workers

    @property
    def loop_steps(self) -> int:
        """Env steps one iteration's loop produces: horizon x the entry worker's replicas x its items."""
        if self.loop is None:
            return 0
        entry = self.info[self.loop.entry.worker]
        return self.loop.horizon * entry.replicas * entry.items_per_replica

    def samples_per_call(self, worker: str) -> int:
        """The most samples one replica of `worker` computes on at once (its memory estimate's batch): a
        training rank's data-parallel share of an iteration's env steps, else its share of a loop step's."""
        info = self.info[worker]
        if info.kind == "training":
            return -(-self.loop_steps // max(1, info.data_parallel))
        per_step = self.loop_steps // self.loop.horizon if self.loop else 1
        return -(-per_step // info.replicas)

    def then_inputs(self, port: PortRef) -> list[PortRef]:
        return [e.src for e in self.then if e.dst == port]

    def to_dot(self) -> str:
        """Graphviz source: one box per worker, edges coloured by phase."""
        colours = {"loop": "#1f77b4", "then": "#2ca02c", "sync": "#d62728"}
        lines = [f'digraph "{self.spec.name}" {{', "  rankdir=LR;", '  node [shape=box, style="rounded,filled"];']
        fill = {
            "simulator": "#dbeafe",
            "inference": "#fef3c7",
            "training": "#fee2e2",
            "buffer": "#dcfce7",
            "function": "#e5e7eb",
        }
        for name, worker in self.spec.workers.items():
            label = f"{name}\\n{worker.kind} x{worker.count}"
            lines.append(f'  "{name}" [label="{label}", fillcolor="{fill[worker.kind]}"];')
        for src, dst, data in self.graph.edges(data=True):
            label = f"{data['src_port']} -> {data['dst_port']}"
            if data["phase"] == "loop" and self.loop:
                label += f"\\n(x{self.loop.horizon})"
            if data["phase"] == "sync":
                label += f"\\n(every {data['every']})"
            colour = colours[data["phase"]]
            lines.append(f'  "{src}" -> "{dst}" [label="{label}", color="{colour}", fontcolor="{colour}"];')
        lines.append("}")
        return "\n".join(lines) + "\n"


def build_graph(spec: WorkflowSpec, source: str | None = None) -> MacroGraph:
    """Resolve every worker, check every edge, and return the validated macro graph."""
    problems: list[str] = []
    info: dict[str, WorkerInfo] = {}
    for name, worker in spec.workers.items():
        try:
            target = resolve(worker.cls, f"workers.{name}.class")
        except SpecError as exc:
            problems.extend(exc.problems)
            continue
        described, found = describe_worker(name, worker, target)
        problems.extend(found)
        if described is not None:
            info[name] = described
    ports = {name: described.ports for name, described in info.items()}

    def check(ref: PortRef, key: str) -> None:
        if ref.worker not in spec.workers:
            known = ", ".join(sorted(spec.workers))
            problems.append(f"{key}: unknown worker '{ref.worker}' (workers declared: {known})")
        elif ref.worker in ports and ref.port not in ports[ref.worker]:
            known = ", ".join(sorted(ports[ref.worker])) or "none"
            problems.append(
                f"{key}: worker '{ref.worker}' ({spec.workers[ref.worker].cls}) has no port '{ref.port}'"
                f" (its ports: {known})"
            )

    graph = nx.MultiDiGraph()
    graph.add_nodes_from(spec.workers)
    flow = spec.flow

    def add(edge: Edge, key: str, phase: str, every: int = 1) -> None:
        check(edge.src, f"{key} (source)")
        check(edge.dst, f"{key} (destination)")
        graph.add_edge(
            edge.src.worker, edge.dst.worker, src_port=edge.src.port, dst_port=edge.dst.port, phase=phase, every=every
        )

    loop = None
    if flow.loop is not None:
        for i, edge in enumerate(flow.loop.edges):
            add(edge, f"flow.loop.edges[{i}] '{edge}'", "loop")
        loop = _loop_chain(flow.loop.edges, flow.loop.horizon, problems)
    for i, edge in enumerate(flow.then):
        add(edge, f"flow.then[{i}] '{edge}'", "then")
    for i, sync in enumerate(flow.sync):
        add(sync.edge, f"flow.sync[{i}].edge '{sync.edge}'", "sync", sync.every)
    problems += _repeated_edges("flow.then", flow.then) + _repeated_edges("flow.sync", [s.edge for s in flow.sync])

    then_order = _then_order(flow.then, problems)
    _check_loop_replicas(spec, loop, info, problems)
    _check_asynchronous(spec, problems)
    _check_threads(spec, problems)
    problems += [
        f"placement.devices.{name}: no worker named '{name}'{did_you_mean(name, spec.workers)}"
        f" (workers: {', '.join(spec.workers)})"
        for name in (spec.placement.devices or {})
        if name not in spec.workers
    ]
    if problems:
        raise SpecError(problems, source)
    macro = MacroGraph(spec, graph, loop, list(flow.then), then_order, list(flow.sync), info)
    problems += _check_shard_splits(macro) + _check_dispatch_ports(macro) + _check_state_splits(macro)
    problems += _check_agreement(macro)
    if problems:
        raise SpecError(problems, source)
    return macro


def _check_agreement(graph: MacroGraph) -> list[str]:
    """Workers joined by a loop or sync edge give the same value to each field both declare agreeing
    (`WorkerConfig.agreeing_fields`): a policy acts in the simulator's env, weights move into the same model."""
    flow = graph.spec.flow
    edges = [(f"flow.loop.edges[{i}]", "loop", e) for i, e in enumerate(flow.loop.edges)] if flow.loop else []
    edges += [(f"flow.sync[{i}].edge", "sync", s.edge) for i, s in enumerate(flow.sync)]
    problems, said = [], set()
    for key, phase, edge in edges:
        src, dst = graph.info[edge.src.worker], graph.info[edge.dst.worker]
        ours, theirs = _agreeing(src, phase, edge.src.port), _agreeing(dst, phase, edge.dst.port)
        for arg in sorted(ours.keys() & theirs.keys()):
            mine, other = ours[arg], theirs[arg]
            if mine.value != other.value and (mine.key, other.key) not in said:
                said.add((mine.key, other.key))
                problems.append(
                    f"{key} '{edge}': workers '{src.name}' and '{dst.name}' must agree on {arg}: {mine.value!r} at"
                    f" workers.{src.name}.args.{mine.key}, {other.value!r} at workers.{dst.name}.args.{other.key};"
                    " give both the same (an override changes only the key it names)"
                )
    return problems


def _agreeing(info: WorkerInfo, phase: str, port: str) -> dict[str, Agreed]:
    agreeing = getattr(info.config, "agreeing", None)
    return agreeing(phase, port) if callable(agreeing) else {}


def _repeated_edges(key: str, edges: list[Edge]) -> list[str]:
    """An edge given twice in one list: its data would move twice."""
    first: dict[str, int] = {}
    problems = []
    for i, edge in enumerate(edges):
        if str(edge) in first:
            problems.append(f"{key}[{i}] '{edge}': the same edge as {key}[{first[str(edge)]}]; give each edge once")
        first.setdefault(str(edge), i)
    return problems


def _check_dispatch_ports(graph: MacroGraph) -> list[str]:
    """Dispatch rules cut coarse calls (then and sync edges); the loop routes each shard to its owner."""
    loop_ports = set(graph.loop.ports) if graph.loop else set()
    return [
        f"workers.{name}.dispatch.{port}: {name}.{port} is a loop port; the loop sends each shard to the replica"
        " that owns it, dispatch rules apply to then- and sync-edge ports"
        for name, worker in graph.workers.items()
        for port in worker.dispatch
        if PortRef(worker=name, port=port) in loop_ports
    ]


def _check_state_splits(graph: MacroGraph) -> list[str]:
    """A split that sends a state to some replicas only (`first`) is for ports sync edges copy a state to: a
    then-edge's batch would reach one replica and leave the others' calls without their part; and not for a
    group's ranks, which all take part in each call."""
    problems = [
        f"flow.then[{i}] '{edge}': {edge.dst} splits its input '{rule.split}', which is for a port a sync edge copies"
        f" a state to; give workers.{edge.dst.worker}.dispatch.{edge.dst.port} split: broadcast or shard"
        for i, edge in enumerate(graph.then)
        if state_only(rule := graph.info[edge.dst.worker].dispatch(edge.dst.port))
    ]
    return problems + [
        f"flow.sync[{i}] '{sync.edge}': {sync.edge.dst} sends the state to some replicas only ('{rule.split}'), but"
        f" {sync.edge.dst.worker}'s replicas are ranks of one group that all take part in each call; give"
        f" workers.{sync.edge.dst.worker}.dispatch.{sync.edge.dst.port} split: broadcast"
        for i, sync in enumerate(graph.sync)
        if (info := graph.info[sync.edge.dst.worker]).group and state_only(rule := info.dispatch(sync.edge.dst.port))
    ]


def _check_shard_splits(graph: MacroGraph) -> list[str]:
    """A port that shards its input over data-parallel ranks needs at least one input shard per rank, and where
    its dispatch is `even`, as many for every rank."""
    problems = []
    for i, edge in enumerate(graph.then):
        dst, src = graph.info[edge.dst.worker], graph.info[edge.src.worker]
        rule = dst.dispatch(edge.dst.port)
        needed = shards_needed(rule, dst.data_parallel)
        scaling = src.spec.scaling  # where the planner chooses the source's count: the shards of the most it may
        given = len(gather(src.dispatch(edge.src.port), list(range(_replica_reach(src).most))))
        if given < needed:
            problems.append(
                f"flow.then[{i}] '{edge}': {edge.dst.worker} splits its input over {needed} data-parallel ranks but"
                f" {edge.src} gives {'at most ' if scaling else ''}{given} shard(s) (one per replica of"
                f" {edge.src.worker}); raise workers.{edge.src.worker}.replicas to {needed} or lower"
                f" workers.{edge.dst.worker}.replicas"
            )
        elif rule.even and given % needed and not (scaling or dst.spec.scaling):  # the planner keeps even ones
            problems.append(
                f"flow.then[{i}] '{edge}': {edge.dst.worker} needs as many input shards on each of its {needed}"
                f" ranks, but {edge.src} gives {given} (one per replica of {edge.src.worker}); give"
                f" workers.{edge.src.worker}.replicas a multiple of workers.{edge.dst.worker}.replicas ({needed})"
            )
    return problems


def _check_threads(spec: WorkflowSpec, problems: list[str]) -> None:
    """A worker computing on several cores borrows its neighbours' cores for its calls: only where none of them
    computes then (`threads_refusal`)."""
    for name, worker in spec.workers.items():
        threads = worker.resources.threads
        if threads not in (1, "auto") and (why := threads_refusal(spec, name)):
            problems.append(f"workers.{name}.resources.threads: {threads}, but {why}; use threads: 1")


def threads_refusal(spec: WorkflowSpec, name: str) -> str | None:
    """Why worker `name` may not compute on cores beside its own, or None where it may: outside the loop of a
    synchronous flow no other worker computes while it does (the cost model charges no contention for it)."""
    if name in _loop_workers(spec):
        return f"{name} runs in the loop, beside the other loop workers on their cores (more replicas spread it)"
    if spec.flow.asynchronous is not None:
        return f"under flow.async {name} runs beside the loop, on the cores the loop computes on"
    return None


def _loop_workers(spec: WorkflowSpec) -> set[str]:
    """The workers the spec's loop edges name (none without a loop)."""
    loop = spec.flow.loop
    return {ref.worker for edge in loop.edges for ref in (edge.src, edge.dst)} if loop is not None else set()


def _check_asynchronous(spec: WorkflowSpec, problems: list[str]) -> None:
    """Training overlaps the loop: it needs both, and a loop worker's after-loop ports must be sources
    (they are read right after its loop, before the next one starts)."""
    flow = spec.flow
    if flow.asynchronous is None:
        return
    if flow.loop is None or not flow.then:
        problems.append("flow.async: overlaps the after-loop edges with the loop; declare flow.loop and flow.then")
        return
    if spec.placement.offload == "always":
        problems.append(
            "placement.offload: 'always' swaps workers out between phases, but under flow.async training runs"
            " beside the loop; use offload: auto or never, or drop flow.async"
        )
    if flow.asynchronous.on_stale == "drop" and flow.asynchronous.max_staleness == 0:
        problems.append(
            "flow.async.on_stale: drop with max_staleness 0 drops every batch collected while training runs (it is"
            " one version old when training is free again): at most every other batch would train; use"
            " max_staleness: 1 or more, or on_stale: block"
        )
    every = spec.run.checkpoint_every
    if every and every <= flow.asynchronous.max_staleness:
        problems.append(
            f"run.checkpoint_every: {every} ends a segment (training catches up, nothing pending) before the loop"
            f" could run {flow.asynchronous.max_staleness} batch(es) ahead; raise it above"
            " flow.async.max_staleness (or 0: only at the end)"
        )
    loop_workers = _loop_workers(spec)
    for i, sync in enumerate(flow.sync):
        worker = spec.workers.get(sync.edge.dst.worker)
        if sync.every > 1 and sync.edge.dst.worker in loop_workers and worker and worker.kind == "inference":
            problems.append(
                f"flow.sync[{i}] '{sync.edge}': every {sync.every} keeps the loop's policy up to"
                f" {sync.every - 1} version(s) older than flow.async.max_staleness allows; use every: 1"
            )
    for i, edge in enumerate(flow.then):
        if edge.dst.worker in loop_workers:
            problems.append(
                f"flow.then[{i}] '{edge}': under flow.async a loop worker's after-loop ports run right after its"
                f" loop, so they cannot take inputs; send {edge.src} elsewhere or drop flow.async"
            )


def _loop_chain(edges: list[Edge], horizon: int, problems: list[str]) -> LoopChain | None:
    chain = [edges[0].src, edges[0].dst]
    for i, edge in enumerate(edges[1:], start=1):
        if edge.src != chain[-1]:
            problems.append(
                f"flow.loop.edges[{i}] '{edge}': must start where the previous edge ends ('{chain[-1]}');"
                " loop edges form a chain such as [env.obs -> policy.act, policy.act -> env.step]"
            )
            return None
        chain.append(edge.dst)
    body = chain[1:]
    repeated = [str(p) for p in body if body.count(p) > 1]
    if repeated:
        problems.append(f"flow.loop.edges: port '{repeated[0]}' repeats inside the loop; each port runs once per step")
        return None
    return LoopChain(tuple(chain), horizon)


def _then_order(edges: list[Edge], problems: list[str]) -> list[PortRef]:
    """Ports of the after-loop phase in dependency order; a cycle there is an error. Ports of one worker
    run in the order the edges first name them (`[env.trajectory -> buffer.add, buffer.sample -> ...]`
    adds before it samples)."""
    dag = nx.DiGraph()
    named: dict[str, list[str]] = {}  # worker -> its ports, in the order the edges first name them
    for edge in edges:
        dag.add_edge(str(edge.src), str(edge.dst))
        for ref in (edge.src, edge.dst):
            ports = named.setdefault(ref.worker, [])
            if str(ref) not in ports:
                ports.append(str(ref))
    for ports in named.values():
        dag.add_edges_from(zip(ports, ports[1:], strict=False))
    try:
        order = list(nx.topological_sort(dag))
    except nx.NetworkXUnfeasible:
        cycle = " -> ".join(src for src, _ in nx.find_cycle(dag))
        problems.append(
            f"flow.then: cycle {cycle} -> ...; only flow.loop may repeat, make the after-loop edges acyclic"
            " (ports of one worker run in the order the edges first name them: reorder the edges if that is it)"
        )
        return []
    return [PortRef.model_validate(name) for name in order]


def _check_loop_replicas(
    spec: WorkflowSpec, loop: LoopChain | None, info: dict[str, WorkerInfo], problems: list[str]
) -> None:
    """Loop batches are cut into one shard per replica of the entry worker; others group shards."""
    if loop is None or loop.entry.worker not in info:
        return
    source = info[loop.entry.worker]
    reach = _replica_reach(source)
    for name in loop.workers:
        if name in spec.workers and spec.workers[name].count > reach.most:
            problems.append(
                f"workers.{name}.replicas: {spec.workers[name].count} replicas, but the loop's batch comes from"
                f" {reach.said}, the loop's first worker, so the extra ones would idle."
                f" Set workers.{name}.replicas <= {reach.most} or raise workers.{source.name}.replicas"
                + (f" (or its args.{source.items_field})" if source.spec.scaling is not None else "")
            )


@dataclass(frozen=True)
class ReplicaReach:
    """The most replicas a worker may have, and a phrase that says so (for a message)."""

    most: int
    said: str


def _replica_reach(info: WorkerInfo) -> ReplicaReach:
    """The replicas `info`'s worker has, or the most the planner may give it: its `max`, and no more than its envs
    where it serves envs."""
    scaling = info.spec.scaling
    if scaling is None:
        return ReplicaReach(info.replicas, f"the {info.replicas} replica(s) of '{info.name}'")
    chosen = f"'{info.name}', which the planner gives at most"
    most = scaling.max or MAX_REPLICAS
    if info.items_field and info.replicas * info.items_per_replica < most:
        envs = info.replicas * info.items_per_replica
        return ReplicaReach(envs, f"{chosen} {envs} replica(s) (one per env of its {envs})")
    return ReplicaReach(most, f"{chosen} {most} replica(s) (its replicas.max)")
