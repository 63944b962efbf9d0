"""Where simulators render. A simulator on a CPU core renders its cameras through EGL on a GPU of its node:
the plan picks the GPUs that no loop worker (inference) uses, so rendering and acting do not time-slice
one GPU (on one H200, acting took 4x as long while 12 simulator processes rendered beside it: RESULTS.md);
where every GPU of the node serves the loop, all of them. A node's simulators take the chosen GPUs in turn.
A simulator placed on a GPU renders there.
"""

from __future__ import annotations

from collections import defaultdict

from m2flow.cluster import DeviceId
from m2flow.graph import MacroGraph
from m2flow.kinds import KINDS
from m2flow.schedule import Plan, ReplicaId


def render_gpus(graph: MacroGraph, plan: Plan) -> dict[ReplicaId, DeviceId]:
    """The GPU each simulator replica renders on (none where its node has no GPU)."""
    acting = _loop_devices(graph, plan)
    turns: dict[int, int] = defaultdict(int)
    chosen = {}
    for name, placement in plan.placements.items():
        if not KINDS[graph.info[name].kind].renders:
            continue
        for r, device in enumerate(placement.replica_devices):
            if device.kind == "gpu":
                chosen[ReplicaId(name, r)] = device
                continue
            gpus = [d for d in plan.cluster.of_kind("gpu") if d.node == device.node]
            if not gpus:
                continue
            free = [d for d in gpus if d not in acting] or gpus
            chosen[ReplicaId(name, r)] = free[turns[device.node] % len(free)]
            turns[device.node] += 1
    return chosen


def render_notes(graph: MacroGraph, plan: Plan) -> list[str]:
    """One line per simulator worker with cameras (`rendering_ports`) that renders on a GPU: which GPUs, and why
    those."""
    by_worker: dict[str, set[str]] = defaultdict(set)
    for replica, gpu in render_gpus(graph, plan).items():
        if graph.info[replica.worker].rendering_ports:
            by_worker[replica.worker].add(gpu.name)
    acting = {d.name for d in _loop_devices(graph, plan)}
    notes = []
    for worker, gpus in sorted(by_worker.items()):
        why = "the GPUs no loop worker uses" if not gpus & acting else "shared with the loop's GPU workers"
        notes.append(f"render: {worker}'s cameras (EGL) on {', '.join(sorted(gpus))}: {why}")
    return notes


def _loop_devices(graph: MacroGraph, plan: Plan) -> set[DeviceId]:
    """Every device a loop worker's replica runs on."""
    loop = graph.loop.workers if graph.loop else []
    return {d for name in loop if name in plan.placements for d in plan.placements[name].replica_devices}
