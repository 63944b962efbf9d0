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
(`beside_rendering`): what a run measures of them there is kept apart (`fit.beside`), as their cost in such plans.
"""

from __future__ import annotations

from collections import defaultdict

from m2flow.cluster import Cluster, DeviceId
from m2flow.graph import MacroGraph
from m2flow.kinds import KINDS
from m2flow.schedule import Placement, Plan, ReplicaId


def render_gpus(graph: MacroGraph, plan: Plan) -> dict[ReplicaId, DeviceId]:
    """The GPU each simulator replica renders on (none where its node has no GPU)."""
    return rendering_on(graph, plan.placements, plan.cluster)


def beside_rendering(
    graph: MacroGraph, placements: dict[str, Placement], stages: int, cluster: Cluster
) -> frozenset[str]:
    """The loop's ports (`worker.port`) that run beside rendering on their GPU (module doc): with two stages or
    more, every loop port of a worker computing on a GPU where another worker's simulators render, and the
    rendering ports of those simulators."""
    if stages < 2 or graph.loop is None:
        return frozenset()
    gpus = {
        name: {d for d in placements[name].replica_devices if d.kind == "gpu"}
        for name in graph.loop.workers
        if name in placements
    }
    if not any(gpus.values()) or not any(_has_cameras(graph, name) for name in graph.loop.workers):
        return frozenset()
    renders_on = {
        r: gpu for r, gpu in rendering_on(graph, placements, cluster).items() if _has_cameras(graph, r.worker)
    }
    ports = set()
    for port in graph.loop.body:
        others = {gpu for name, used in gpus.items() if name != port.worker for gpu in used}
        rendered_by_others = {gpu for replica, gpu in renders_on.items() if replica.worker != port.worker}
        own_renders = {gpu for replica, gpu in renders_on.items() if replica.worker == port.worker}
        if gpus.get(port.worker, set()) & rendered_by_others:
            ports.add(str(port))  # computing where others render
        elif own_renders & others and graph.info[port.worker].renders(port.port):
            ports.add(str(port))  # rendering where others compute
    return frozenset(ports)


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
    return bool(graph.info[worker].rendering_ports)


def _loop_devices(graph: MacroGraph, placements: dict[str, Placement]) -> set[DeviceId]:
    """Every device a loop worker's replica runs on."""
    loop = graph.loop.workers if graph.loop else []
    return {d for name in loop if name in placements for d in placements[name].replica_devices}
