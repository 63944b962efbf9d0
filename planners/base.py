"""The planner interface: graph + cluster + profile -> Plan. One subclass per placement mode."""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass
from typing import ClassVar

from m2flow.cluster import Cluster, DeviceId
from m2flow.errors import PlanError
from m2flow.graph import MacroGraph
from m2flow.kinds import KINDS
from m2flow.overlap import Overlap
from m2flow.planners.memory import memory_shares, share_notes
from m2flow.planners.merging import merge_notes, merge_slices
from m2flow.planners.offload import OffloadInfeasible, choose_offload, with_swaps
from m2flow.planners.processes import COLOCATE_GAIN, Processes, process_options
from m2flow.planners.profile import Profile
from m2flow.planners.render import ReplicaPort, beside_rendering, ports_of
from m2flow.planners.simulate import Simulated, simulation
from m2flow.planners.simulation_cache import Shared
from m2flow.planners.threads import threads_notes
from m2flow.program import build_phases, part_port
from m2flow.schedule import Candidate, MicroSchedule, Phase, Placement, Plan, Prediction

_PLANNERS: dict[str, type[Planner]] = {}


class Infeasible(Exception):
    """This candidate cannot run on this cluster; the message says why and what would fix it."""


def register(cls: type[Planner]) -> type[Planner]:
    _PLANNERS[cls.mode] = cls
    return cls


def get_planner(mode: str) -> Planner:
    if mode not in _PLANNERS:
        raise PlanError(f"placement.mode: unknown mode '{mode}' (known: {', '.join(sorted(_PLANNERS))})")
    return _PLANNERS[mode]()


def placement_modes() -> list[str]:
    return [m for m in _PLANNERS if m != "auto"]


class Planner(ABC):
    mode: ClassVar[str]

    @abstractmethod
    def plan(self, graph: MacroGraph, cluster: Cluster, profile: Profile) -> Plan:
        """The plan this planner chooses, or raise PlanError naming what does not fit."""


class PlacementPlanner(Planner):
    """A planner for one placement mode: it picks placements; stages come from the simulator."""

    def label(self, placements: dict[str, Placement]) -> str:
        return self.mode

    @abstractmethod
    def placements(self, graph: MacroGraph, cluster: Cluster, profile: Profile) -> dict[str, Placement]:
        """Where each worker runs, or raise Infeasible."""

    def candidates(self, graph: MacroGraph, cluster: Cluster, profile: Profile) -> dict[str, dict[str, Placement]]:
        """Named alternative placements within this mode (e.g. device splits); the simulator picks one."""
        return {"": self.placements(graph, cluster, profile)}

    def plan(self, graph: MacroGraph, cluster: Cluster, profile: Profile) -> Plan:
        check_cluster(graph, cluster)
        try:
            options = self.candidates(graph, cluster, profile)
        except Infeasible as exc:
            raise PlanError(f"placement.mode={self.mode}: {exc}") from None
        best = self._best_split(graph, cluster, profile, options)
        choice, simulated = best.choice, best.choice.simulated
        prediction, stages = simulated.prediction, simulated.stages
        beside = beside_rendering(graph, best.placements, stages, cluster)
        prediction.cost_sources = profile.sources_in(beside)
        plan = Plan(
            workflow=graph.spec.name,
            mode=self.label(best.placements),
            cluster=cluster,
            placements=best.placements,
            pipeline_stages=stages,
            phases=best.phases,
            predicted=prediction,
            tasks=MicroSchedule(simulated.tasks),
        )
        plan.processes = choice.processes
        plan.merge_slices = merge_slices(graph, profile, stages, ports_of(beside))
        memory_notes = []
        if graph.spec.placement.memory_shares:
            plan.memory_shares, memory_notes = memory_shares(
                best.placements, best.phases, best.offloaded, choice.processes, cluster, profile
            )
        plan.candidates = [Candidate.of(plan.mode, stages, prediction)]
        if len(options) > 1:
            plan.notes.append(f"{self.mode}: devices split {best.name} (best of {len(options)} splits)")
        if best.offloaded:
            swapping = ", ".join(sorted(best.offloaded))
            plan.notes.append(f"{self.mode}: {swapping} swap out of shared devices between phases")
        plan.notes += streaming_notes(graph, best.phases, prediction)
        if choice.why:
            plan.notes.append(choice.why)
        plan.notes += merge_notes(graph, profile, stages, ports_of(beside))
        for group in plan.processes:
            plan.notes.append(f"one process: {' + '.join(map(str, group))} (placement.colocate)")
        plan.notes += memory_notes + share_notes(plan) + threads_notes(graph, plan)
        return plan

    def _best_split(
        self, graph: MacroGraph, cluster: Cluster, profile: Profile, options: dict[str, dict[str, Placement]]
    ) -> _Split:
        """The device split predicted fastest, with its swaps, phases and process layout."""
        best: _Split | None = None
        reasons = []
        for name, placements in options.items():
            try:
                offloaded = choose_offload(graph, placements, cluster, profile)
            except OffloadInfeasible as exc:
                reasons.append(str(exc))
                continue
            phases = with_swaps(build_phases(graph), offloaded)
            choice = choose_processes(graph, cluster, placements, profile, phases)
            if best is None or choice.iteration_s < best.choice.iteration_s:
                best = _Split(name, placements, offloaded, phases, choice)
        if best is None:
            raise PlanError(f"placement.mode={self.mode}: {reasons[0]}")
        return best


@dataclass
class _Split:
    """A device split of a mode, with the swaps, phases and process layout chosen for it."""

    name: str
    placements: dict[str, Placement]
    offloaded: set[str]
    phases: list[Phase]
    choice: Choice


def streaming_notes(graph: MacroGraph, phases: list[Phase], prediction: Prediction) -> list[str]:
    """Why each then-edge streams or waits for the whole loop (or, asynchronous, what overlapping it gives)."""
    notes = []
    asynchronous = graph.spec.flow.asynchronous
    if asynchronous is not None:
        run = graph.spec.run
        segment = min(run.checkpoint_every or run.iterations, run.iterations)
        return [
            Overlap.of(asynchronous).explain(
                segment, prediction.phase_s.get("loop", 0.0), prediction.phase_s.get("then", 0.0)
            )
        ]
    for phase in (p for p in phases if p.op == "then"):
        for edge in graph.then:
            if edge in phase.streamed:
                part = getattr(graph.info[edge.dst.worker].target, part_port(edge).port)
                what = " ".join((part.__doc__ or "").split()) or "no docstring"
                notes.append(
                    f"then: {edge} streams: each loop replica's part goes to {edge.dst.worker}.{edge.dst.port}_part"
                    f" as that replica finishes; {edge.dst.worker}.{edge.dst.port} then gets the whole list"
                    f" ({edge.dst.port}_part: {what})"
                )
            elif phase.offload or phase.onload:
                notes.append(f"then: {edge} waits for the whole loop: a context switch comes first")
            else:
                notes.append(
                    f"then: {edge} waits for the whole loop: {edge.dst.worker} takes no parts (no {edge.dst.port}_part)"
                    if edge.src.worker in (graph.loop.workers if graph.loop else [])
                    else f"then: {edge} runs after {edge.src} (not a loop output)"
                )
    return notes


def device_kind(graph: MacroGraph, worker: str, cluster: Cluster) -> str:
    spec = graph.workers[worker]
    wanted = spec.resources.device
    if wanted == "auto":
        return "gpu" if cluster.count("gpu") and KINDS[spec.kind].accelerator else "cpu"
    return wanted


def check_cluster(graph: MacroGraph, cluster: Cluster) -> None:
    """Problems no placement can fix: a GPU worker without GPUs, more replicas than devices, more threads a
    replica than a node has cores."""
    for name, spec in graph.workers.items():
        kind = device_kind(graph, name, cluster)
        have = cluster.count(kind)
        if have == 0:
            raise PlanError(
                f"workers.{name}.resources.device: '{kind}' but the cluster has no {kind} devices;"
                f" set cluster.{kind}s or workers.{name}.resources.device"
            )
        if spec.count > have:
            raise PlanError(
                f"workers.{name}.replicas: {spec.count} replicas need {spec.count} {kind} devices,"
                f" the cluster has {have}; lower workers.{name}.replicas or raise cluster.{kind}s"
            )
        threads = spec.resources.threads
        if kind == "cpu" and threads != "auto" and threads > (cores := cluster.fewest_cores()):
            raise PlanError(
                f"workers.{name}.resources.threads: {threads} cores a replica, but a node of the cluster has"
                f" {cores}; lower workers.{name}.resources.threads to {cores} at most"
            )


def stage_options(graph: MacroGraph, profile: Profile) -> list[int]:
    wanted = graph.spec.placement.pipeline_stages
    if graph.loop is None:
        return [1]
    entry = graph.info[graph.loop.entry.worker]
    items = profile.items_per_replica.get(entry.name, 1)
    if wanted == "auto":
        return [s for s in (1, 2, 4) if s <= items]
    if wanted > items:
        where = f"args.{entry.items_field}" if entry.items_field else "items per replica"
        raise PlanError(
            f"placement.pipeline_stages: {wanted} slices, but each replica of '{entry.name}'"
            f" holds {items} item(s); use at most {items} stages or raise workers.{entry.name}.{where}"
        )
    return [wanted]


@dataclass
class Choice:
    """A placement's process layout (`placement.colocate`), why auto chose it when it weighed two (else ""),
    and the simulation of its best stage count."""

    processes: Processes
    why: str
    simulated: Simulated

    @property
    def iteration_s(self) -> float:
        return self.simulated.prediction.iteration_s


def best_stages(
    graph: MacroGraph,
    placements: dict[str, Placement],
    profile: Profile,
    phases: list[Phase],
    processes: Processes,
    shared: Shared,
    pipelined_beside: frozenset[ReplicaPort],
) -> Simulated:
    """The simulation of the stage count predicted fastest (the fewest on a tie); what simulations of these
    placements share comes from `shared`, or is simulated once and kept there. `pipelined_beside`: what runs beside
    rendering at two stages or more (`planners/render.py`)."""
    options = stage_options(graph, profile)
    results = [
        simulation(
            graph,
            placements,
            s,
            profile,
            phases,
            processes,
            shared,
            beside_rendering=pipelined_beside if s > 1 else frozenset(),
        )
        for s in options
    ]
    return min(results, key=lambda r: (r.prediction.iteration_s, r.stages))


def choose_processes(
    graph: MacroGraph, cluster: Cluster, placements: dict[str, Placement], profile: Profile, phases: list[Phase]
) -> Choice:
    """The process layout and stage count predicted fastest, co-hosting only for a gain of `COLOCATE_GAIN`."""
    options = process_options(graph, placements)
    shared = Shared()  # each layout's phases outside the loop and loop components, for every stage count
    pipelined_beside = beside_rendering(graph, placements, 2, cluster)  # alike at any stage count over one
    results = [best_stages(graph, placements, profile, phases, o, shared, pipelined_beside) for o in options]
    if len(options) == 1:
        return Choice(options[0], "", results[0])
    apart, together = (r.prediction.iteration_s for r in results)
    gain = apart / together - 1 if together > 0 else 0.0
    if gain >= COLOCATE_GAIN:
        why = f"colocate: auto co-hosts replicas on one device: predicted {gain:.1%} faster without hops"
        return Choice(options[1], why, results[1])
    why = (
        f"colocate: auto keeps a process per replica: co-hosting is predicted {gain:.1%} faster, under the"
        f" {COLOCATE_GAIN:.0%} it must gain to be worth a process that hides which worker crashed"
    )
    return Choice(options[0], why, results[0])


def spread(
    worker: str, replicas: int, devices: list[DeviceId], placed: dict[str, Placement] | None = None
) -> Placement:
    """Replicas over the given devices: round-robin from the first (co-located with whoever else starts
    there, as `shared` means), or, given the workers `placed` so far, each on the least-loaded device."""
    if placed is None:
        return Placement(worker, list(devices), [devices[r % len(devices)] for r in range(replicas)])
    load = Counter(d for p in placed.values() for d in p.replica_devices)
    lowest_first = sorted(devices)
    least = [(load[d], i) for i, d in enumerate(lowest_first)]  # a heap: the least loaded first, the lowest on a tie
    heapq.heapify(least)
    chosen = []
    for _ in range(replicas):
        occupants, i = heapq.heappop(least)
        chosen.append(lowest_first[i])
        heapq.heappush(least, (occupants + 1, i))
    return Placement(worker, list(devices), chosen)


def split_devices(
    workers: list[str], pool: list[DeviceId], weight: dict[str, float], replicas: dict[str, int]
) -> dict[str, list[DeviceId]]:
    """Disjoint device sets: one each, then the rest to whoever has most work per device (up to its replicas)."""
    if len(pool) < len(workers):
        raise Infeasible(
            f"{len(workers)} workers ({', '.join(workers)}) need disjoint devices but only {len(pool)} exist;"
            " use mode shared or hybrid, or add devices"
        )
    count = {w: 1 for w in workers}
    for _ in range(len(pool) - len(workers)):
        open_ = [w for w in workers if count[w] < replicas[w]]
        if not open_:
            break
        busiest = max(open_, key=lambda w: weight.get(w, 0.0) / count[w])
        count[busiest] += 1
    out, at = {}, 0
    for w in workers:
        out[w] = pool[at : at + count[w]]
        at += count[w]
    return out
