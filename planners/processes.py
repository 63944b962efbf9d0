"""Which worker replicas share one process (`placement.colocate: true`).

Replicas of loop workers placed on the same device run in one process: the loop's per-step messages
between them become direct calls — no pickling, no channel hop, no process wake-up — which is what a
hand-written loop pays. Multi-rank training groups keep a process per rank (their process groups).
Each process holds at most one replica of a worker.
"""

from __future__ import annotations

from collections import defaultdict

from m2flow.cluster import DeviceId
from m2flow.graph import MacroGraph
from m2flow.schedule import Placement, ReplicaId


def process_groups(graph: MacroGraph, placements: dict[str, Placement]) -> list[list[ReplicaId]]:
    """Groups of two or more replicas that share a process; every other replica has its own."""
    if not graph.spec.placement.colocate or graph.loop is None:
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


def same_process(groups: list[list[ReplicaId]]) -> dict[ReplicaId, int]:
    """Member -> its process group's index (members alone in their process are absent)."""
    return {member: i for i, group in enumerate(groups) for member in group}
