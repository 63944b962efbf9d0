"""Auto: plan every mode at its allowed stage counts, drop the infeasible, pick the fastest, explain.
(How many replicas each worker gets is `allocation.py`'s, around whichever mode plans.)"""

from __future__ import annotations

from m2flow.cluster import Cluster
from m2flow.errors import PlanError
from m2flow.graph import MacroGraph
from m2flow.planners.base import Planner, check_cluster, get_planner, placement_modes, register
from m2flow.planners.profile import Profile
from m2flow.schedule import Candidate, Plan


@register
class AutoPlanner(Planner):
    mode = "auto"

    def plan(self, graph: MacroGraph, cluster: Cluster, profile: Profile) -> Plan:
        check_cluster(graph, cluster)
        plans, rejected = [], []
        for mode in placement_modes():
            try:
                plans.append(get_planner(mode).plan(graph, cluster, profile))
            except PlanError as exc:
                rejected.append(Candidate.infeasible(mode, str(exc)))
        if not plans:
            reasons = "\n".join(f"  - {reason}" for reason in dict.fromkeys(r.reason for r in rejected))
            raise PlanError(f"placement.mode=auto: no placement fits this cluster:\n{reasons}")
        plans.sort(key=lambda p: p.predicted.iteration_s)
        best = plans[0]
        best.candidates = [row for p in plans for row in p.candidates] + rejected
        best.notes.insert(0, explain(plans))  # the decision first
        return best


def explain(plans: list[Plan]) -> str:
    best = plans[0]
    line = f"auto chose {best.mode} with {best.pipeline_stages} stage(s): {best.predicted.iteration_s:.4g} s/iteration"
    if len(plans) > 1:
        runner = plans[1]
        ratio = runner.predicted.iteration_s / best.predicted.iteration_s
        line += f"; next best {runner.mode} ({runner.pipeline_stages} stage(s)) is {ratio:.2f}x slower"
    return line
