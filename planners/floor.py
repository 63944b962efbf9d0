"""A floor under the iteration of any plan of a graph's replica counts, found without simulating one.

Each loop replica's calls run one at a time, in program order, whatever the placement, the stage count or the
process layout (a call that shares its CPU core with other processes' calls takes longer, never less): an
iteration's loop takes at least the busiest replica's own work over the horizon. A port's cost is a line with
a non-negative per-call part, so however a step's rows are cut into slices (or merged back), the calls of a
step cost at least one call on all of them; a port with a cost beside rendering too (`planners/render.py`) counts
the lesser of its two lines. In a synchronous flow the after-loop ports run once the loop is
done, and take at least as long as the call of one of them on the most rows a replica can be given. The
allocation search skips a layout whose floor is above the best plan it has found (`planners/allocation.py`).
"""

from __future__ import annotations

from m2flow.graph import MacroGraph
from m2flow.planners.profile import Profile
from m2flow.program import own_items
from m2flow.sharding import shard_groups
from m2flow.spec import PortRef


def iteration_floor_s(graph: MacroGraph, profile: Profile) -> float:
    """The loop's floor, and in a synchronous flow the after-loop phase's after it (under `flow.async` that
    phase runs beside the next loop)."""
    floor_s = loop_floor_s(graph, profile)
    if graph.spec.flow.asynchronous is None:
        floor_s += then_floor_s(graph, profile)
    return floor_s


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
            busiest = max(busiest, sum(profile.least_call_s(worker, port, rows) for port in ports))
    return busiest * loop.horizon


def then_floor_s(graph: MacroGraph, profile: Profile) -> float:
    """The after-loop call with the most rows a replica must be given, counted low: a port without inputs
    works on its own share; a broadcast hands each replica all it receives, a shard at least an even part of
    it per data-parallel rank; what a port passes on is all its replicas received (or, gathered from rank
    zero, what that one received: all of it broadcast, none counted when sharded)."""
    passed_on: dict[PortRef, float] = {}  # per port, the fewest rows its outputs can carry in all
    slowest = 0.0
    for port in graph.then_order:
        info = graph.info[port.worker]
        rule = info.dispatch(port.port)
        sources = graph.then_inputs(port)
        if sources:
            received = sum(passed_on[source] for source in sources)
            broadcast = rule.split == "broadcast"
            busiest = received if broadcast else received / max(1, info.data_parallel)
            passed_on[port] = received if rule.gather == "all" or broadcast else 0.0
        else:
            own = [own_items(graph, port.worker, r, "then") for r in range(info.replicas)]
            busiest = max(own)
            passed_on[port] = sum(own) if rule.gather == "all" else own[0]
        slowest = max(slowest, profile.least_call_s(port.worker, port.port, busiest))
    return slowest
