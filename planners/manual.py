"""Manual layouts: `placement.devices` pins workers by hand, in the syntax RLinf users know.

`{env: 0-3, rollout: 4-7, actor: all}`: indices count devices of the worker's kind (GPUs for GPU
workers, CPU slots otherwise); overlapping sets share, disjoint sets are disaggregated. Workers left
out span all devices of their kind. The planner only checks feasibility and fills in the rest.
"""

from __future__ import annotations

from m2flow.cluster import Cluster
from m2flow.errors import PlanError
from m2flow.graph import MacroGraph
from m2flow.planners.base import PlacementPlanner, device_kind, spread
from m2flow.planners.profile import Profile
from m2flow.schedule import Placement
from m2flow.spec import device_list


def parse_devices(text: str | int | list[int], available: int, key: str) -> list[int]:
    """`all`, `3`, `0-3`, `0,2,5`, `0-1,4` or a list -> sorted device indices, checked against `available`."""
    try:
        wanted = device_list(text)
    except ValueError as exc:
        raise PlanError(f"{key}: {exc}") from None
    wanted = list(range(available)) if wanted is None else wanted
    bad = [d for d in wanted if not 0 <= d < available]
    if bad or not wanted:
        raise PlanError(f"{key}: devices {bad or text} do not exist; the cluster has {available} (0-{available - 1})")
    return sorted(set(wanted))


def layout_mode(placements: dict[str, Placement]) -> str:
    """What a hand layout amounts to: shared, disaggregated, or hybrid (some sets overlap, some not)."""
    names = list(placements)
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]
    overlapping = [bool(set(placements[a].devices) & set(placements[b].devices)) for a, b in pairs]
    if all(overlapping):
        return "shared"
    return "disaggregated" if not any(overlapping) else "hybrid"


class ManualPlanner(PlacementPlanner):
    mode = "manual"

    def label(self, placements: dict[str, Placement]) -> str:
        return f"manual ({layout_mode(placements)})"

    def placements(self, graph: MacroGraph, cluster: Cluster, profile: Profile) -> dict[str, Placement]:
        wanted = graph.spec.placement.devices or {}  # names the workers' (`graph.build_graph` checks)
        out = {}
        for name, spec in graph.workers.items():
            kind = device_kind(graph, name, cluster)
            pool = cluster.of_kind(kind)
            chosen = parse_devices(wanted.get(name, "all"), len(pool), f"placement.devices.{name}")
            out[name] = spread(name, spec.count, [pool[i] for i in chosen], out)
        return out
