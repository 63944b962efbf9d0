"""A floor under the iteration of any plan of a graph's replica counts, found without simulating one.

Each loop replica's calls run one at a time, in program order, on its device, whatever the placement, the
stage count or the process layout: an iteration's loop takes at least the busiest replica's own work over the
horizon. A port's cost is a line with a non-negative per-call part, so however a step's rows are cut into
slices (or merged back), the calls of a step cost at least one call on all of them. The allocation search
skips a layout whose floor is above the best plan it has found (`planners/allocation.py`).
"""

from __future__ import annotations

from m2flow.graph import MacroGraph
from m2flow.planners.profile import Profile
from m2flow.sharding import shard_groups


def loop_floor_s(graph: MacroGraph, profile: Profile) -> float:
    """The busiest loop replica's own work over the horizon: each step, one call of each of its loop ports on
    all the rows its shards hold."""
    loop = graph.loop
    if loop is None:
        return 0.0
    entry = loop.entry.worker
    n_shards = graph.workers[entry].count
    items = profile.items_per_replica.get(entry, 1)
    busiest = 0.0
    for worker in loop.workers:
        ports = [port.port for port in loop.body if port.worker == worker]
        for group in shard_groups(n_shards, graph.workers[worker].count):
            rows = items * len(group)
            busiest = max(busiest, sum(profile.call_s(worker, port, rows) for port in ports))
    return busiest * loop.horizon
