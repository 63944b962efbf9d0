"""Disaggregated: every worker on its own devices, sized by how much work it does."""

from __future__ import annotations

from m2flow.cluster import Cluster
from m2flow.graph import MacroGraph
from m2flow.planners.base import PlacementPlanner, device_kind, register, split_devices, spread
from m2flow.planners.profile import Profile
from m2flow.schedule import Placement


def work_weights(graph: MacroGraph, profile: Profile) -> dict[str, float]:
    """Seconds of work per iteration each worker does, from the profile (to size device sets)."""
    loop_items = 0
    if graph.loop is not None:
        entry = graph.loop.entry.worker
        loop_items = profile.items_per_replica.get(entry, 1) * graph.workers[entry].replicas
    weight = {name: 0.0 for name in graph.workers}
    if graph.loop is not None:
        for port in graph.loop.body:
            weight[port.worker] += graph.loop.horizon * profile.call_s(port.worker, port.port, loop_items)
    horizon = graph.loop.horizon if graph.loop else 1
    for port in graph.then_order:
        weight[port.worker] += profile.call_s(port.worker, port.port, loop_items * horizon)
    return weight


def disjoint(graph: MacroGraph, cluster: Cluster, profile: Profile, workers: list[str]) -> dict[str, Placement]:
    """Disjoint device sets for `workers`, per device kind."""
    weight = work_weights(graph, profile)
    out = {}
    by_kind: dict[str, list[str]] = {}
    for name in workers:
        by_kind.setdefault(device_kind(graph, name, cluster), []).append(name)
    for kind, names in by_kind.items():
        pool = [d.index for d in cluster.of_kind(kind)]
        sets = split_devices(names, pool, weight, {n: graph.workers[n].replicas for n in names})
        for name in names:
            out[name] = spread(name, graph.workers[name].replicas, sets[name], kind)
    return out


@register
class DisaggregatedPlanner(PlacementPlanner):
    mode = "disaggregated"

    def placements(self, graph: MacroGraph, cluster: Cluster, profile: Profile) -> dict[str, Placement]:
        return disjoint(graph, cluster, profile, list(graph.workers))
