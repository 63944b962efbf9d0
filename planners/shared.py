"""Shared (collocated): every worker spans all devices of its kind and time-multiplexes them."""

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
        out = {}
        for name, spec in graph.workers.items():
            kind = device_kind(graph, name, cluster)
            out[name] = spread(name, spec.count, cluster.of_kind(kind))
        return out
