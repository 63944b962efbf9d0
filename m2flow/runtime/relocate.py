"""Where a replica whose node is gone starts again in place: on a device the run still holds.

A loop replica replaced in place starts on its planned device. When that device's node no longer runs a
task (gone, cut off), a replica on a CPU core borrows the least occupied core among those the run has
reserved on the nodes that still answer: it holds no share of it (its occupants hold it whole), so the
loop goes on, slower, until the run restarts and re-plans. A GPU-placed replica is not moved (Ray gives a
process that holds no share of a GPU no GPU at all), nor is a training worker (its ranks' placement is the
plan's to make): the run restarts and re-plans without the node.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from m2flow.cluster import Cluster, DeviceId
from m2flow.runtime.nodes import driver_node, unreachable


def lost_nodes(cluster: Cluster, devices: Iterable[DeviceId], reach_s: float) -> set[int]:
    """The nodes of `devices` that do not run a no-op task within `reach_s`; none asked on one node, nor the
    driver's own."""
    if len(cluster.node_ids) < 2:
        return set()
    here = driver_node()
    asked = sorted({device.node for device in devices if cluster.node_ids[device.node] != here})
    if not asked:
        return set()
    gone = unreachable(tuple(cluster.node_ids[node] for node in asked), reach_s)
    return {node for node in asked if cluster.node_ids[node] in gone}


def stand_in(device: DeviceId, reserved: Iterable[DeviceId], lost: set[int], load: Counter) -> DeviceId | None:
    """The core a replica planned on CPU core `device` (on a lost node) borrows: of the `reserved` cores on
    nodes not `lost`, the one the fewest replicas run on (`load`), the first of those on a tie; None where
    none is left, or `device` is a GPU."""
    if device.kind != "cpu":
        return None
    left = [d for d in reserved if d.kind == "cpu" and d.node not in lost]
    return min(left, key=lambda d: (load[d], d), default=None)
