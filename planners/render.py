"""Where simulators render. A simulator on a CPU core renders its cameras through EGL on a GPU of its node:
the plan picks the GPUs that no loop worker (inference) uses, so rendering and acting do not time-slice
one GPU (on one H200, acting took 4x as long while 12 simulator processes rendered beside it: RESULTS.md);
where every GPU of the node serves the loop, all of them. A node's simulators take the chosen GPUs in turn.
A simulator placed on a GPU renders there.

Where simulators render on a GPU that a loop worker also computes on, how the two share it depends on the stages:
in one stage the simulators render while the policy waits for their observations, and the policy acts while they
wait for its actions; with two stages or more, one stage's simulators render while the policy acts for another,
and the GPU time-slices between them (on an H100, a CNN policy's act of 32 envs took 1.8-2.0 ms so, one of 64 envs
alone 1.05-1.17 ms: benchmarks/results/gpu48). Such ports are *beside rendering* in a plan of two stages or more
(`beside_rendering`, replica by replica): what a run measures of them there is kept apart (`trace_calls.rendering_key`),
as their cost in such plans.
"""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

from m2flow.cluster import Cluster, DeviceId
from m2flow.graph import MacroGraph
from m2flow.kinds import KINDS
from m2flow.schedule import Placement, Plan, ReplicaId


def render_gpus(graph: MacroGraph, plan: Plan) -> dict[ReplicaId, DeviceId]:
    """The GPU each simulator replica renders on (none where its node has no GPU)."""
    return rendering_on(graph, plan.placements, plan.cluster)


def camera_gpus(graph: MacroGraph, plan: Plan) -> set[DeviceId]:
    """The GPUs that simulators with cameras render on: in use, even where no replica is placed on them."""
    return {gpu for replica, gpu in render_gpus(graph, plan).items() if _has_cameras(graph, replica.worker)}


class ReplicaPort(NamedTuple):
    """A port of one replica: `env[2].step`."""

    replica: ReplicaId
    port: str  # its name on the replica's worker

    @property
    def key(self) -> str:
        """The port's key in a profile: `env.step`."""
        return f"{self.replica.worker}.{self.port}"


def beside_rendering(
    graph: MacroGraph, placements: dict[str, Placement], stages: int, cluster: Cluster
) -> frozenset[ReplicaPort]:
    """The loop's ports of each replica that run beside rendering on their GPU (module doc): with two stages or
    more, those of a replica computing on a GPU where another worker's simulators render, and the rendering ports
    of a simulator replica whose GPU another worker computes on."""
    if stages < 2 or graph.loop is None or not any(_has_cameras(graph, name) for name in graph.loop.workers):
        return frozenset()
    computing = {
        ReplicaId(name, r): device
        for name in graph.loop.workers
        if name in placements
        for r, device in enumerate(placements[name].replica_devices)
        if device.kind == "gpu"
    }
    if not computing:
        return frozenset()
    renders_on = {
        r: gpu for r, gpu in rendering_on(graph, placements, cluster).items() if _has_cameras(graph, r.worker)
    }
    rendered_by: dict[DeviceId, set[str]] = defaultdict(set)  # a GPU -> the workers whose simulators render there
    for replica, gpu in renders_on.items():
        rendered_by[gpu].add(replica.worker)
    computed_by: dict[DeviceId, set[str]] = defaultdict(set)  # a GPU -> the loop workers computing on it
    for replica, gpu in computing.items():
        computed_by[gpu].add(replica.worker)
    beside = set()
    for port in graph.loop.body:
        renders = graph.info[port.worker].renders(port.port)
        for r in range(len(placements[port.worker].replica_devices) if port.worker in placements else 0):
            me = ReplicaId(port.worker, r)
            computes_beside = me in computing and rendered_by[computing[me]] - {port.worker}
            renders_beside = renders and me in renders_on and computed_by[renders_on[me]] - {port.worker}
            if computes_beside or renders_beside:
                beside.add(ReplicaPort(me, port.port))
    return frozenset(beside)


def ports_of(calls: frozenset[ReplicaPort]) -> frozenset[str]:
    """The ports (`worker.port`) some replica of which runs beside rendering."""
    return frozenset(call.key for call in calls)


def rendering_on(graph: MacroGraph, placements: dict[str, Placement], cluster: Cluster) -> dict[ReplicaId, DeviceId]:
    """The GPU each simulator replica of `placements` renders on (`render_gpus`)."""
    acting = _loop_devices(graph, placements)
    gpus_of: dict[int, list[DeviceId]] = defaultdict(list)
    for gpu in cluster.of_kind("gpu"):
        gpus_of[gpu.node].append(gpu)
    free_of = {node: [d for d in gpus if d not in acting] or gpus for node, gpus in gpus_of.items()}
    turns: dict[int, int] = defaultdict(int)
    chosen = {}
    for name, placement in placements.items():
        if not KINDS[graph.info[name].kind].renders:
            continue
        for r, device in enumerate(placement.replica_devices):
            if device.kind == "gpu":
                chosen[ReplicaId(name, r)] = device
                continue
            free = free_of.get(device.node)
            if not free:
                continue
            chosen[ReplicaId(name, r)] = free[turns[device.node] % len(free)]
            turns[device.node] += 1
    return chosen


def render_notes(graph: MacroGraph, plan: Plan) -> list[str]:
    """One line per simulator worker with cameras (`rendering_ports`) that renders on a GPU: which GPUs, and why
    those."""
    by_worker: dict[str, set[str]] = defaultdict(set)
    for replica, gpu in render_gpus(graph, plan).items():
        if _has_cameras(graph, replica.worker):
            by_worker[replica.worker].add(gpu.name)
    acting = {d.name for d in _loop_devices(graph, plan.placements)}
    notes = []
    for worker, gpus in sorted(by_worker.items()):
        why = "the GPUs no loop worker uses" if not gpus & acting else "shared with the loop's GPU workers"
        notes.append(f"render: {worker}'s cameras (EGL) on {', '.join(sorted(gpus))}: {why}")
    return notes


def _has_cameras(graph: MacroGraph, worker: str) -> bool:
    """Whether `worker` declares ports that render (`rendering_ports`): a simulator without cameras draws nothing."""
    return bool(graph.info[worker].rendering_ports)


def _loop_devices(graph: MacroGraph, placements: dict[str, Placement]) -> set[DeviceId]:
    """Every device a loop worker's replica runs on."""
    loop = graph.loop.workers if graph.loop else []
    return {d for name in loop if name in placements for d in placements[name].replica_devices}
