"""Shared (collocated): every worker spans all devices of its kind and time-multiplexes them. Replicas start
round-robin from the first device; under `flow.async` the workers outside the loop (training) start on the
devices holding the fewest replicas, since they run beside the loop."""

from __future__ import annotations

from m2flow.cluster import Cluster
from m2flow.graph import MacroGraph
from m2flow.planners.base import PlacementPlanner, device_kind, register, spread
from m2flow.planners.profile import Profile
from m2flow.schedule import Placement


@register
class SharedPlanner(PlacementPlanner):
    mode = "shared"

    def placements(self, graph: MacroGraph, cluster: Cluster, profile: Profile) -> dict[str, Placement]:
        beside = graph.spec.flow.asynchronous is not None and graph.loop is not None
        loop = set(graph.loop.workers) if beside else set()
        out = {}
        for name in sorted(graph.workers, key=lambda n: n not in loop):  # the loop's workers first
            kind = device_kind(graph, name, cluster)
            placed = out if beside and name not in loop else None
            out[name] = spread(name, graph.workers[name].count, cluster.of_kind(kind), placed)
        return {name: out[name] for name in graph.workers}
