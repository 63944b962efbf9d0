"""Cost of each worker port and memory of each worker, merged from their sources.

A call of a port costs `fixed_s + per_item_s * items`; for a simulator, items are the envs stepped. Precedence: declared
in the workflow (`workers.<w>.profile`, `resources.memory_gb`) > measured (`m2flow profile`, a profile.json) > cached
(what earlier runs of the same worker measured, `cache.py`) > estimated (a worker class's `memory_estimate_gb(config,
samples)`) > defaults by worker kind (a GPU's where the port's work will run on one: `ON_GPU_COST`). A port whose cost
is a default is *unknown*: `m2flow run` measures it in its first iterations and re-plans. A loop port's cost beside
rendering on its GPU (`planners/render.py`) is kept under its own key (`trace_calls.rendering_key`), for the plans
that run it so; measured only so, it stands in for the port's own cost, which stays unknown (`schedule.stands_in`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from m2flow.errors import PlanError
from m2flow.graph import MacroGraph
from m2flow.planners.fit import PortFit, ReplicaShares
from m2flow.planners.render import ReplicaPort, ports_of, render_gpus
from m2flow.planners.trace_calls import port_of_key, rendering_key
from m2flow.schedule import BESIDE_RENDERING, DEFAULT_SOURCE, HANDOFF_SOURCE, Plan, ReplicaId, guessed, stands_in
from m2flow.spec import PortCost

T = TypeVar("T")
DEFAULT_COST = {
    "simulator": PortCost(fixed_s=5e-5, per_item_s=2e-4),
    "inference": PortCost(fixed_s=3e-4, per_item_s=2e-5),
    "training": PortCost(fixed_s=1e-2, per_item_s=2e-5),
    "buffer": PortCost(fixed_s=1e-4, per_item_s=1e-6),
    "function": PortCost(fixed_s=1e-4, per_item_s=0.0),
}
# Work on a GPU is flat at small batches (a kernel launch, a frame's readback): where a port's work runs on one, nothing
# measured costs these, and a cost measured at one batch size is split as these are: near the medians of the lines the
# lent H100s fitted through several sizes, the last line of each of five camera-ViT sweeps (benchmarks/results/gpu28,
# gpu31, gpu40: the only GPU workload measured so). A camera simulator's step rendered through EGL: 1.93-2.55 ms a call
# (median 2.39) + 0-0.22 ms an env (median 0.11) at 2-8 envs; a ViT policy's act: 2.03-2.39 ms a call (median 2.09) +
# 0.020-0.033 ms an env (median 0.022) at 16-64. Kinds not named keep DEFAULT_COST.
ON_GPU_COST = {
    "simulator": PortCost(fixed_s=2.4e-3, per_item_s=1.2e-4),
    "inference": PortCost(fixed_s=2.2e-3, per_item_s=2e-5),
}
# Ports that only hand data on (a trajectory, weights): a fixed cost, whatever the worker's kind.
HANDOFF_COST = PortCost(fixed_s=1e-3, per_item_s=0.0)
HOST_DEVICE_GB_PER_S = 20.0  # a swap moves a worker's memory between device and pinned host memory
CHANNEL_HOP_S = 1e-4  # receiving one loop message from another process on the node (measured: m2flow profile)
HOP_ITEM_S = 0.0  # and each item it carries (an env's observation, action, reward): measured, calibrated by runs
CONTROLLER_S = 5e-3  # the driver's own time per iteration: coarse calls' round trips, waits, metrics hooks


@dataclass
class Profile:
    costs: dict[str, PortCost] = field(default_factory=dict)
    items_per_replica: dict[str, int] = field(default_factory=dict)
    memory_gb: dict[str, float] = field(default_factory=dict)
    memory_advice: dict[str, str] = field(default_factory=dict)  # per worker: what lowers its memory (its class's)
    source: dict[str, str] = field(default_factory=dict)
    prior: dict[str, PortCost] = field(default_factory=dict)  # what a port is assumed to cost, knowing nothing
    prior_on_gpu: dict[str, PortCost] = field(default_factory=dict)  # and where its work runs on a GPU
    split_measured: set[str] = field(default_factory=set)  # ports `m2flow profile` measured at two sizes or more
    # per port called outside the loop, each replica's share of its cost at the replica counts measured
    replica_shares: dict[str, ReplicaShares] = field(default_factory=dict)
    hop_s: float = CHANNEL_HOP_S  # a loop message between processes, whatever it carries
    hop_item_s: float = HOP_ITEM_S  # and per item it carries: a message of a slice of fewer envs costs less
    # the same as a run of one execution measured it (`schedule.execution_id`): it differs from plan to plan
    execution_hops: dict[str, float] = field(default_factory=dict)
    controller_s: float = CONTROLLER_S  # measured by a run's calibration: its iterations minus their tasks
    # how much longer work takes on a device that the loop and a phase beside it (training, under flow.async)
    # both load than alone, time-sliced between their processes: measured by an asynchronous run
    beside_slowdown: float = 1.0

    def copy(self) -> Profile:
        """A profile whose tables are its own (a refit changes costs in place)."""
        return replace(
            self,
            costs=dict(self.costs),
            items_per_replica=dict(self.items_per_replica),
            memory_gb=dict(self.memory_gb),
            memory_advice=dict(self.memory_advice),
            source=dict(self.source),
            prior=dict(self.prior),
            prior_on_gpu=dict(self.prior_on_gpu),
            split_measured=set(self.split_measured),
            replica_shares=dict(self.replica_shares),
            execution_hops=dict(self.execution_hops),
        )

    def set_fit(self, port: str, fit: PortFit) -> None:
        """`port` costs what `fit` measured, its replicas' shares too."""
        self.costs[port] = fit.cost
        if fit.replica_shares:
            self.replica_shares[port] = fit.replica_shares
        else:
            self.replica_shares.pop(port, None)

    def set_seen(self, port: str, fit: PortFit, source: str) -> None:
        """`port` costs what `fit` measured (`source`: by whom); measured beside rendering (its key
        `rendering_key(...)`), it stands for the port's cost alone too until a run measures that (`stands_in`)."""
        self.set_fit(port, fit)
        self.source[port] = source
        alone = port_of_key(port)
        if alone != port and (guessed(self.source.get(alone, DEFAULT_SOURCE)) or stands_in(self.source[alone])):
            self.set_fit(alone, fit)
            self.source[alone] = standing_in(source)

    def sources_in(self, beside_rendering: frozenset[ReplicaPort]) -> dict[str, str]:
        """Where each port's cost came from, as a plan whose replicas' ports `beside_rendering` run beside rendering
        costs them (`call_s`): its cost beside rendering, where a run measured one."""
        sources = {port: source for port, source in self.source.items() if not port.endswith(BESIDE_RENDERING)}
        for port in ports_of(beside_rendering):
            if rendering_key(port) in self.source:
                sources[port] = self.source[rendering_key(port)]
        return sources

    def least_call_s(self, worker: str, port: str, items: float) -> float:
        """The least a call of `worker.port` on `items` costs in any plan: beside rendering or not (a floor)."""
        return min(self.call_s(worker, port, items), self.call_s(worker, port, items, beside_rendering=True))

    def call_s(self, worker: str, port: str, items: float, beside_rendering: bool = False) -> float:
        """A call of `worker.port` on `items`; `beside_rendering`: in a plan where it runs beside rendering on its
        GPU (`planners/render.py`), at what a run measured it cost there, if one did."""
        key = f"{worker}.{port}"
        beside = rendering_key(key)
        cost = self.costs.get(beside if beside_rendering and beside in self.costs else key, HANDOFF_COST)
        return cost.fixed_s + cost.per_item_s * items

    def replica_call_s(self, replica: ReplicaId, port: str, items: float, replicas: int) -> float:
        """A call of `replica`'s port outside the loop, one of `replicas`: its share of the port's cost
        (`replica_share`)."""
        shares = self.replica_shares.get(f"{replica.worker}.{port}", {})
        return replica_share(shares, replica.replica, replicas) * self.call_s(replica.worker, port, items)

    def swap_s(self, worker: str, device_kind: str) -> float:
        """One offload or onload: the worker's measured/declared `onload` cost, else memory over bandwidth."""
        if self.source.get(f"{worker}.onload") in ("declared", "measured", "cached"):
            return self.costs[f"{worker}.onload"].fixed_s
        return self.memory_gb.get(worker, 0.0) / HOST_DEVICE_GB_PER_S if device_kind == "gpu" else 0.0

    def per_call_fraction(self, port: str, items: float, on_gpu: bool) -> float:
        """What part of a call of `port` at `items` its cost puts in the per-call term — as `m2flow profile`
        measured it at two batch sizes or more, or else as the default for its worker's kind, on a GPU if its work
        runs on one (`on_gpu`; not as declared: a declared cost the run measured otherwise is no guide to its
        split): the prior for a fit that saw one batch size only."""
        priors = self.prior_on_gpu if on_gpu else self.prior
        alone = port_of_key(port)  # beside rendering too, the split of its kind's work
        cost = self.costs[alone] if alone in self.split_measured else priors.get(alone, HANDOFF_COST)
        total = cost.fixed_s + cost.per_item_s * items
        return cost.fixed_s / total if total > 0 else 1.0

    @classmethod
    def from_graph(
        cls,
        graph: MacroGraph,
        measured: dict[str, Any] | None = None,
        cached: dict[str, PortFit] | None = None,
        on_gpu: frozenset[str] = frozenset(),
    ) -> Profile:
        """Merge the sources; ports that compute (loop body, terminal after-loop ports) default by
        worker kind, as a GPU runs it for the ports in `on_gpu` (`ON_GPU_COST`), ports that hand data on are assumed
        to cost a small fixed amount."""
        measured, cached = measured or {}, cached or {}
        measured_ports = measured.get("ports", {})
        sources = {str(e.src) for e in graph.then} | {str(s.edge.src) for s in graph.sync}
        computing = {str(p) for p in graph.loop.body} if graph.loop else set()
        computing |= {str(p) for p in graph.then_order if str(p) not in sources}
        profile = cls(hop_s=measured.get("hop_s", CHANNEL_HOP_S), hop_item_s=measured.get("hop_item_s", HOP_ITEM_S))
        for name, worker in graph.workers.items():
            profile.items_per_replica[name] = graph.info[name].items_per_replica
            profile.memory_gb[name], profile.source[f"{name}.memory"] = _memory(graph, name)
            advice = _memory_advice(graph, name) if profile.source[f"{name}.memory"] == "estimated" else None
            if advice:
                profile.memory_advice[name] = advice
            for port in graph.info[name].ports:
                key = f"{name}.{port}"
                profile.prior[key] = DEFAULT_COST[worker.kind] if key in computing else HANDOFF_COST
                gpu_prior = ON_GPU_COST.get(worker.kind, DEFAULT_COST[worker.kind])
                profile.prior_on_gpu[key] = gpu_prior if key in computing else HANDOFF_COST
                if port in worker.profile:
                    profile.costs[key], profile.source[key] = worker.profile[port], "declared"
                elif key in measured_ports:
                    profile.set_fit(key, measured_ports[key])
                    profile.source[key] = "measured"
                    if len(measured_ports[key].batch_sizes) > 1:
                        profile.split_measured.add(key)
                elif key in cached:
                    profile.set_fit(key, cached[key])
                    profile.source[key] = "cached"
                else:
                    profile.costs[key] = (profile.prior_on_gpu if key in on_gpu else profile.prior)[key]
                    profile.source[key] = DEFAULT_SOURCE if key in computing else HANDOFF_SOURCE
                beside = rendering_key(key)  # its cost beside rendering, as `m2flow profile` or runs measured it
                if beside in measured_ports and profile.source[key] != "declared":
                    profile.set_seen(beside, measured_ports[beside], "measured")
                elif beside in cached and profile.source[key] != "declared":
                    profile.set_seen(beside, cached[beside], "cached")
        return profile


def standing_in(source: str) -> str:
    """The source of a port's cost that its cost beside rendering, from `source`, stands for: "cached" -> "cached
    beside rendering", "measured (this run)" -> "measured beside rendering (this run)" (`stands_in`)."""
    what, bracket, rest = source.partition(" (")
    return f"{what}{BESIDE_RENDERING}{bracket}{rest}"


def ports_on_gpu(graph: MacroGraph, plan: Plan) -> set[str]:
    """The ports whose work runs on a GPU under `plan`: every port of a worker placed on GPUs, and the ports that
    render cameras (`rendering_ports`) of a simulator that renders on one (`planners/render.py`)."""
    rendering = {replica.worker for replica in render_gpus(graph, plan)}
    on_gpu = set()
    for name, placement in plan.placements.items():
        info = graph.info[name]
        placed = any(device.kind == "gpu" for device in placement.replica_devices)
        on_gpu |= {f"{name}.{port}" for port in info.ports if placed or (name in rendering and info.renders(port))}
    return on_gpu


def replica_share(measured: ReplicaShares, replica: int, replicas: int) -> float:
    """Replica `replica`'s share of a port's cost, one of `replicas`: as a run of as many replicas measured it (work
    done on the first replica alone: 2.0 and 0.0); at a count no run measured, the first replica's share and
    the others' mean as measured at the nearest count, so that work done on the first replica alone stays its own
    whatever the count (what rank-zero work does); even where nothing was measured."""
    if not measured:
        return 1.0
    shares = measured.get(replicas) or measured[min(measured, key=lambda count: (abs(count - replicas), count))]
    if len(shares) == replicas:
        return shares[replica]
    others = shares[1:]
    return shares[0] if replica == 0 else sum(others) / len(others)


def _memory(graph: MacroGraph, name: str) -> tuple[float, str]:
    """Declared memory, else the worker class's `memory_estimate_gb(config, samples)`, else none."""
    declared = graph.workers[name].resources.memory_gb
    if declared > 0:
        return declared, "declared"
    fix = f"Fix the worker's args, or declare workers.{name}.resources.memory_gb to skip the estimate"
    estimate = _asked(graph, name, "memory_estimate_gb", float, fix)
    return (0.0, DEFAULT_SOURCE) if estimate is None else (estimate, "estimated")


def _memory_advice(graph: MacroGraph, name: str) -> str | None:
    """The worker class's `memory_advice(config, samples)`: what lowers a replica's memory, in its args' keys."""
    return _asked(graph, name, "memory_advice", str, "Fix the worker's args, or the class's memory_advice")


def _asked(graph: MacroGraph, name: str, method: str, read: Callable[[Any], T], fix: str) -> T | None:
    """What worker `name`'s class answers to `method(config, samples)`, as `read` reads it (None: the class has no
    such method). A failure of that user code is a planning error naming the worker and the method, and `fix`."""
    info = graph.info[name]
    answer = getattr(info.target, method, None)
    if not callable(answer):
        return None
    try:
        return read(answer(info.config, graph.samples_per_call(name)))
    except Exception as exc:  # noqa: BLE001 - any failure of user code here is a planning error to report
        failed = f"workers.{name}: {info.spec.cls}.{method} failed: {type(exc).__name__}: {exc}"
        raise PlanError(f"{failed}. {fix}") from None
