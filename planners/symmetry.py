"""Loop replicas that schedule alike: the loop's independent parts, and which of them are copies of another.

Inside the loop a replica waits only on the replicas whose shards it shares, on its device's queue and on
the neighbours in its process. The replicas these tie together form independent components. Two components
whose replicas line up one to one, in index order (the same workers, shards of the same sizes wired the same
way, the same devices and processes shared the same way, the same ports beside rendering: `planners/render.py`),
run the same schedule on other devices: the simulator schedules the first component of each class and copies its
tasks to the rest: the same schedule as simulating each (per-port sums may differ in their last bits, added in
another order), and on a cluster of like replicas the loop costs one component's tasks, not every replica's.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable
from dataclasses import dataclass

from m2flow.cluster import DeviceId
from m2flow.graph import MacroGraph
from m2flow.planners.render import ReplicaPort
from m2flow.schedule import ReplicaId
from m2flow.sharding import shard_groups


@dataclass(frozen=True)
class Component:
    """Loop replicas that only wait on each other: by loop worker, then index; their devices in first use."""

    replicas: tuple[ReplicaId, ...]
    devices: tuple[DeviceId, ...]


@dataclass(frozen=True)
class LoopClass:
    """Components with one schedule: the first is simulated, each other one copies it position by position."""

    components: tuple[Component, ...]

    @property
    def model(self) -> Component:
        return self.components[0]

    @property
    def copies(self) -> tuple[Component, ...]:
        return self.components[1:]


def loop_classes(
    graph: MacroGraph,
    devices: dict[str, list[DeviceId]],
    together: dict[ReplicaId, int],
    beside_rendering: frozenset[ReplicaPort],
) -> list[LoopClass]:
    """The loop's components grouped into classes of copies, in order of their first replica; a replica's ports in
    `beside_rendering` cost what they cost there, so components copy one another only where theirs line up too."""
    loop = graph.loop
    n_shards = graph.workers[loop.entry.worker].count
    groups = {w: shard_groups(n_shards, graph.workers[w].count) for w in loop.workers}
    ports_beside: dict[ReplicaId, list[str]] = defaultdict(list)
    for call in sorted(beside_rendering):
        ports_beside[call.replica].append(call.port)
    classes: dict[tuple, list[Component]] = {}
    for replicas in _components(loop.workers, groups, devices, together):
        shape, used = _shape(replicas, groups, devices, together, ports_beside)
        classes.setdefault(shape, []).append(Component(replicas, used))
    return [LoopClass(tuple(members)) for members in classes.values()]


def _components(
    workers: list[str],
    groups: dict[str, list[list[int]]],
    devices: dict[str, list[DeviceId]],
    together: dict[ReplicaId, int],
) -> list[tuple[ReplicaId, ...]]:
    """Replicas tied by a shard, a device or a process, by union-find."""
    parent: dict[Hashable, Hashable] = {}

    def root(key: Hashable) -> Hashable:
        while parent.setdefault(key, key) != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    def tie(a: Hashable, b: Hashable) -> None:
        parent[root(a)] = root(b)

    replicas = [ReplicaId(w, r) for w in workers for r in range(len(groups[w]))]
    for me in replicas:  # tagged keys, so a worker's name never meets a shard's or a process's key
        for shard in groups[me.worker][me.replica]:
            tie(("replica", me), ("shard", shard))
        tie(("replica", me), ("device", devices[me.worker][me.replica]))
        if me in together:
            tie(("replica", me), ("process", together[me]))
    members: dict[Hashable, list[ReplicaId]] = defaultdict(list)
    for me in replicas:
        members[root(("replica", me))].append(me)
    return [tuple(group) for group in members.values()]


def _shape(
    replicas: tuple[ReplicaId, ...],
    groups: dict[str, list[list[int]]],
    devices: dict[str, list[DeviceId]],
    together: dict[ReplicaId, int],
    ports_beside: dict[ReplicaId, list[str]],
) -> tuple[tuple, tuple[DeviceId, ...]]:
    """What the component's schedule depends on, with shards, devices and processes renamed by first use, and each
    replica's ports beside rendering (`ports_beside`, in order); and its devices in that order."""
    shards: dict[int, int] = {}
    used: dict[DeviceId, int] = {}
    processes: dict[int, int] = {}
    shape = []
    for me in replicas:
        own = tuple(shards.setdefault(b, len(shards)) for b in groups[me.worker][me.replica])
        device = used.setdefault(devices[me.worker][me.replica], len(used))
        process = processes.setdefault(together[me], len(processes)) if me in together else -1
        shape.append((me.worker, own, device, process, tuple(ports_beside.get(me, ()))))
    return tuple(shape), tuple(used)
