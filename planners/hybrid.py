"""Hybrid: the interaction loop's workers on disjoint devices (so their stages pipeline),
every other worker (training) spanning all devices of its kind and swapping with them."""

from __future__ import annotations

from m2flow.cluster import Cluster
from m2flow.graph import MacroGraph
from m2flow.planners.base import Infeasible, PlacementPlanner, device_kind, register, spread
from m2flow.planners.disaggregated import disjoint, distinct, split_weights, work_weights
from m2flow.planners.profile import Profile
from m2flow.schedule import Placement


@register
class HybridPlanner(PlacementPlanner):
    mode = "hybrid"

    def placements(self, graph: MacroGraph, cluster: Cluster, profile: Profile) -> dict[str, Placement]:
        return self._layout(graph, cluster, work_weights(graph, profile))

    def candidates(self, graph: MacroGraph, cluster: Cluster, profile: Profile) -> dict[str, dict[str, Placement]]:
        return distinct(
            {name: self._layout(graph, cluster, weight) for name, weight in split_weights(graph, profile).items()}
        )

    @staticmethod
    def _layout(graph: MacroGraph, cluster: Cluster, weight: dict[str, float]) -> dict[str, Placement]:
        if graph.loop is None or len(graph.loop.workers) < 2:
            raise Infeasible("hybrid needs an interaction loop between two workers (flow.loop)")
        out = disjoint(graph, cluster, graph.loop.workers, weight)
        for name, spec in graph.workers.items():
            if name not in out:
                kind = device_kind(graph, name, cluster)
                out[name] = spread(name, spec.count, cluster.of_kind(kind), out)
        return out
