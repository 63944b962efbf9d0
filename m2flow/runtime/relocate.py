"""Where a replica whose node is gone starts again in place: on a core the run still holds.

A loop replica replaced in place starts on its planned device. When that device's node no longer runs a
task (gone, cut off), a replica on a CPU core borrows the least occupied core among those the run has
reserved on the nodes that still answer: it holds no share of it (its occupants hold it whole), so the
loop goes on, slower, until the run restarts and re-plans (a simulator that rendered on its node's GPU
renders on one of the borrowed core's node). A replica that cannot move that way — on a GPU (Ray gives a
process that holds no share of a GPU no GPU at all), a training rank (its placement is the plan's to
make) — or a lost node that still hosts replicas not being replaced now fails the replacement: the run
restarts and re-plans without the node.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from m2flow.cluster import Cluster, DeviceId
from m2flow.errors import WorkerError
from m2flow.schedule import ReplicaId

Probe = Callable[[tuple[str, ...], float], set[str]]  # (Ray node ids, seconds) -> those that did not answer


@dataclass(frozen=True)
class Move:
    """A replica started away from the device it ran on, whose node no longer answered."""

    borrowed: DeviceId
    address: str  # the lost node's


class Relocator:
    """The nodes one launch found lost, and the cores its replicas borrowed off them."""

    def __init__(
        self,
        cluster: Cluster,
        reserved: Iterable[DeviceId],
        reach_s: float,
        probe: Probe,
        here: str | None,
        address: Callable[[str], str],
    ):
        """`reserved`: the devices the run holds; `probe` asks nodes within `reach_s`; `here`: the driver's node
        (never asked); `address`: a Ray node id's address, for messages."""
        self.cluster, self.reserved, self.reach_s = cluster, list(reserved), reach_s
        self.probe, self.here, self.address = probe, here, address
        self.lost: set[int] = set()  # the plan's nodes found lost
        self.moves: dict[ReplicaId, Move] = {}

    def device_of(self, replica: ReplicaId, planned: DeviceId) -> DeviceId:
        move = self.moves.get(replica)
        return planned if move is None else move.borrowed

    def lost_ids(self) -> frozenset[str]:
        """The Ray node ids of the nodes found lost."""
        return frozenset(self.cluster.node_ids[node] for node in self.lost)

    def find_lost(self, devices: Iterable[DeviceId]) -> set[int]:
        """The nodes of `devices` that are lost: found so before, or not running a no-op task within
        `reach_s` now. On one node nothing is asked, nor of the driver's own node."""
        ids = self.cluster.node_ids
        if len(ids) < 2:
            return set()
        nodes = {device.node for device in devices}
        asked = sorted(node for node in nodes - self.lost if ids[node] != self.here)
        if asked:
            gone = self.probe(tuple(ids[node] for node in asked), self.reach_s)
            self.lost |= {node for node in asked if ids[node] in gone}
        return nodes & self.lost

    def move(
        self,
        failed: Mapping[ReplicaId, DeviceId],
        running: Mapping[ReplicaId, DeviceId],
        unmovable: Callable[[ReplicaId, DeviceId], str | None] = lambda *_: None,
    ) -> None:
        """Each of `failed` (replica -> the device it ran on) whose node is lost borrows a core on a node left,
        the least occupied by `running` (every replica of the launch -> its device). All or none: a WorkerError
        where one of them cannot move (`unmovable` says why) or a lost node still hosts a replica not in
        `failed` (it cannot be gone around: the run restarts and re-plans)."""
        lost = self.find_lost(failed.values())
        if not lost:
            return
        for replica, device in sorted(failed.items()):
            why = (_on_gpu(device) or unmovable(replica, device)) if device.node in lost else None
            if why:
                raise WorkerError(
                    f"{replica} ran on the node at {self._address_of(device)}, which no longer answers, and {why}:"
                    " the run restarts and re-plans on the nodes left"
                )
        stranded = sorted(r for r, device in running.items() if device.node in lost and r not in failed)
        if stranded:
            names = ", ".join(self.address(self.cluster.node_ids[node]) for node in sorted(lost))
            raise WorkerError(
                f"the node(s) at {names} no longer answer, with {', '.join(map(str, stranded))} still placed"
                " there: the run restarts and re-plans on the nodes left"
            )
        load = Counter(device for device in running.values() if device.node not in lost)
        moves = {}
        for replica, device in sorted(failed.items()):
            if device.node not in lost:
                continue
            borrowed = stand_in(self.reserved, self.lost, load)
            if borrowed is None:
                raise WorkerError(
                    f"{replica} ran on the node at {self._address_of(device)}, which no longer answers, and this run"
                    " holds no CPU core on another node: the run restarts and re-plans on the nodes left"
                )
            moves[replica] = Move(borrowed, self._address_of(device))
            load[borrowed] += 1
        self.moves.update(moves)

    def _address_of(self, device: DeviceId) -> str:
        return self.address(self.cluster.node_ids[device.node])


def _on_gpu(device: DeviceId) -> str | None:
    if device.kind == "gpu":
        return "a GPU-placed replica moves only by a re-plan (Ray gives a process that holds no share of a GPU no GPU)"
    return None


def stand_in(reserved: Iterable[DeviceId], lost: set[int], load: Counter) -> DeviceId | None:
    """The core a replica that ran on a CPU core of a lost node borrows: of the `reserved` cores on nodes not
    `lost`, the one the fewest replicas run on (`load`), the first of those on a tie; None where none is left."""
    left = [d for d in reserved if d.kind == "cpu" and d.node not in lost]
    return min(left, key=lambda d: (load[d], d), default=None)
