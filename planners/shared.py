"""Shared (collocated): every worker spans all devices of its kind and time-multiplexes them. Replicas start
round-robin from the first device, except that a loop worker with fewer replicas than the simulator puts each
on a device of the simulator replicas it serves (`beside_its_shards`); under `flow.async` the workers outside
the loop (training) start on the devices holding the fewest replicas, since they run beside the loop."""

from __future__ import annotations

from m2flow.cluster import Cluster, DeviceId
from m2flow.graph import MacroGraph
from m2flow.planners.base import PlacementPlanner, device_kind, register, spread
from m2flow.planners.profile import Profile
from m2flow.schedule import Placement
from m2flow.sharding import shards_of


@register
class SharedPlanner(PlacementPlanner):
    mode = "shared"

    def placements(self, graph: MacroGraph, cluster: Cluster, profile: Profile) -> dict[str, Placement]:
        beside = graph.spec.flow.asynchronous is not None and graph.loop is not None
        in_loop = set(graph.loop.workers) if graph.loop is not None else set()
        out = {}
        for name in (n for n in graph.workers if n in in_loop):  # the loop's workers first
            out[name] = spread(name, graph.workers[name].count, cluster.of_kind(device_kind(graph, name, cluster)))
        if graph.loop is not None:
            entry = out[graph.loop.entry.worker]
            for name in graph.loop.workers:
                fewer = len(out[name].replica_devices) < len(entry.replica_devices)
                if fewer and out[name].device_kind == entry.device_kind:
                    out[name] = beside_its_shards(out[name], entry.replica_devices)
        for name in (n for n in graph.workers if n not in in_loop):  # beside the loop: where it loads least
            devices = cluster.of_kind(device_kind(graph, name, cluster))
            out[name] = spread(name, graph.workers[name].count, devices, out if beside else None)
        return {name: out[name] for name in graph.workers}


def beside_its_shards(placement: Placement, entry_devices: list[DeviceId]) -> Placement:
    """Each replica on the device of the first simulator replica whose shard it serves (simulator replicas
    have a device each, so the blocks' devices differ): a slice's messages start on the device, and replicas
    that serve like blocks sit alike (the planner's simulator then computes one block for all:
    `planners/symmetry.py`)."""
    replicas, n_shards = len(placement.replica_devices), len(entry_devices)
    chosen = [entry_devices[shards_of(n_shards, replicas, r)[0]] for r in range(replicas)]
    return Placement(placement.worker, placement.devices, chosen)
