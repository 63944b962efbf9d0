"""Planning: pure computation over the macro graph, the cluster and the profile (no Ray, no torch)."""

from m2flow.planners import auto, disaggregated, hybrid, shared  # noqa: F401  (register the modes)
from m2flow.planners.base import Infeasible, Planner, get_planner, placement_modes
from m2flow.planners.profile import Profile

__all__ = ["Infeasible", "Planner", "Profile", "get_planner", "placement_modes", "make_plan"]


def make_plan(graph, cluster, profile=None, mode: str | None = None):
    """Plan `graph` on `cluster` in `mode` (default: the workflow's placement.mode)."""
    profile = profile or Profile.from_graph(graph)
    return get_planner(mode or graph.spec.placement.mode).plan(graph, cluster, profile)
