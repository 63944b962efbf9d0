"""Online re-planning: refit the profile from the run's own trace and switch plan if clearly better.

Between iterations, after the first traced ones (the first warms up), the measured port costs
replace declared and default ones; the planner plans again in the workflow's mode; the run moves
to the new plan only if it is predicted at least `REPLAN_GAIN` faster than the current one under
the same refit profile.
"""

from __future__ import annotations

from m2flow.cluster import Cluster
from m2flow.graph import MacroGraph
from m2flow.planners import Profile, make_plan
from m2flow.planners.fit import fit_points, points_from_trace
from m2flow.planners.simulate import simulate
from m2flow.schedule import Plan
from m2flow.spec import PortCost

REPLAN_GAIN = 0.10


def refit(graph: MacroGraph, events: list[dict], measured: dict | None) -> Profile:
    """The profile with every port seen in `events` set to its fitted cost (these override all else)."""
    profile = Profile.from_graph(graph, measured)
    fitted = fit_points(points_from_trace({"traceEvents": events}, skip_iterations=1), "online")
    for port, fit in fitted["ports"].items():
        if port in profile.costs:
            profile.costs[port] = PortCost(fixed_s=fit["fixed_s"], per_item_s=fit["per_item_s"])
            profile.source[port] = "measured (online)"
    return profile


def replan(
    graph: MacroGraph, cluster: Cluster, current: Plan, events: list[dict], measured: dict | None
) -> tuple[Plan | None, str]:
    """(the better plan or None, why) — the reason is logged either way."""
    profile = refit(graph, events, measured)
    best = make_plan(graph, cluster, profile)
    now, _ = simulate(graph, current.placements, current.pipeline_stages, profile, current.phases)
    now_s, new_s = now.iteration_s, best.predicted.iteration_s
    same = (best.mode, best.pipeline_stages) == (current.mode, current.pipeline_stages)
    if same or new_s > now_s * (1 - REPLAN_GAIN):
        return None, (
            f"replan: keeping {current.mode} S={current.pipeline_stages}: with the measured costs it is"
            f" predicted {now_s:.3g} s/iteration, the best alternative {best.mode}"
            f" S={best.pipeline_stages} {new_s:.3g} s"
        )
    return best, (
        f"replan: switching {current.mode} S={current.pipeline_stages} -> {best.mode}"
        f" S={best.pipeline_stages}: with the measured costs {now_s:.3g} -> {new_s:.3g} s/iteration"
        f" ({now_s / new_s:.2f}x)"
    )
