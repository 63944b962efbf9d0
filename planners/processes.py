"""Which worker replicas share one process (`placement.colocate`).

Replicas of loop workers placed on the same device can run in one process: the loop's per-step messages
between them become direct calls — no pickling, no channel hop, no process wake-up — which is what a
hand-written loop pays. Multi-rank training groups keep a process per rank (their process groups).
Each process holds at most one replica of a worker. `colocate: auto` (the default) co-hosts them only
where that is predicted at least `COLOCATE_GAIN` faster: a crash in a co-hosted worker takes its process
neighbours with it and the failure names the process rather than the worker, and a small predicted gain
is within the cost model's error.
"""

from __future__ import annotations

from collections import defaultdict

from m2flow.cluster import DeviceId
from m2flow.graph import MacroGraph
from m2flow.schedule import Placement, ReplicaId

COLOCATE_GAIN = 0.05

Processes = list[list[ReplicaId]]  # groups of two or more replicas sharing a process; the others alone


def process_options(graph: MacroGraph, placements: dict[str, Placement]) -> list[Processes]:
    """The process layouts `placement.colocate` lets the planner weigh: one per replica, co-hosted, or
    (auto) both when co-hosting groups anything."""
    wanted = graph.spec.placement.colocate
    groups = process_groups(graph, placements)
    if wanted is False or not groups:
        return [[]]
    return [groups] if wanted is True else [[], groups]


def process_groups(graph: MacroGraph, placements: dict[str, Placement]) -> Processes:
    """Loop workers' replicas on one device, grouped to share a process (groups of two or more)."""
    if graph.loop is None:
        return []
    on_device: dict[DeviceId, list[list[ReplicaId]]] = defaultdict(list)
    for worker in graph.loop.workers:
        if graph.info[worker].group and graph.workers[worker].count > 1:
            continue
        seen: dict[DeviceId, int] = defaultdict(int)
        for replica, device in enumerate(placements[worker].replica_devices):
            slots = on_device[device]
            if seen[device] == len(slots):
                slots.append([])
            slots[seen[device]].append(ReplicaId(worker, replica))
            seen[device] += 1
    return [group for slots in on_device.values() for group in slots if len(group) > 1]


def same_process(groups: Processes) -> dict[ReplicaId, int]:
    """Member -> its process group's index (members alone in their process are absent)."""
    return {member: i for i, group in enumerate(groups) for member in group}


def process_of(together: dict[ReplicaId, int], replica: ReplicaId) -> int | ReplicaId:
    """The process `replica` runs in: its co-hosting group's index in `together` (`same_process`), else its own."""
    return together.get(replica, replica)
