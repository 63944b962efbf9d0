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
        loop_items = profile.items_per_replica.get(entry, 1) * graph.workers[entry].count
    weight = {name: 0.0 for name in graph.workers}
    if graph.loop is not None:
        for port in graph.loop.body:
            weight[port.worker] += graph.loop.horizon * profile.call_s(port.worker, port.port, loop_items)
    horizon = graph.loop.horizon if graph.loop else 1
    for port in graph.then_order:
        weight[port.worker] += profile.call_s(port.worker, port.port, loop_items * horizon)
    return weight


def split_weights(graph: MacroGraph, profile: Profile) -> dict[str, dict[str, float]]:
    """Ways to size disjoint device sets: by predicted work, by replica count, evenly."""
    return {
        "by work": work_weights(graph, profile),
        "by replicas": {name: float(w.count) for name, w in graph.workers.items()},
        "evenly": dict.fromkeys(graph.workers, 1.0),
    }


def disjoint(graph: MacroGraph, cluster: Cluster, workers: list[str], weight: dict[str, float]) -> dict[str, Placement]:
    """Disjoint device sets for `workers`, per device kind, sized by `weight`."""
    out = {}
    by_kind: dict[str, list[str]] = {}
    for name in workers:
        by_kind.setdefault(device_kind(graph, name, cluster), []).append(name)
    for kind, names in by_kind.items():
        sets = split_devices(names, cluster.of_kind(kind), weight, {n: graph.workers[n].count for n in names})
        for name in names:
            out[name] = spread(name, graph.workers[name].count, sets[name], out)
    return out


def distinct(options: dict[str, dict[str, Placement]]) -> dict[str, dict[str, Placement]]:
    """Drop splits that came out the same."""
    seen, out = set(), {}
    for name, placements in options.items():
        key = tuple((w, tuple(p.replica_devices)) for w, p in sorted(placements.items()))
        if key not in seen:
            seen.add(key)
            out[name] = placements
    return out


@register
class DisaggregatedPlanner(PlacementPlanner):
    mode = "disaggregated"

    def placements(self, graph: MacroGraph, cluster: Cluster, profile: Profile) -> dict[str, Placement]:
        return disjoint(graph, cluster, list(graph.workers), work_weights(graph, profile))

    def candidates(self, graph: MacroGraph, cluster: Cluster, profile: Profile) -> dict[str, dict[str, Placement]]:
        return distinct(
            {
                name: disjoint(graph, cluster, list(graph.workers), weight)
                for name, weight in split_weights(graph, profile).items()
            }
        )
