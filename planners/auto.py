"""Auto: plan every mode (and its pipeline stages, and optionally every split of the simulator's envs
into processes), drop the infeasible, pick the fastest, explain."""

from __future__ import annotations

import copy
from dataclasses import replace

from m2flow.cluster import Cluster
from m2flow.config import apply_overrides, spec_from_dict
from m2flow.errors import PlanError, SpecError
from m2flow.graph import MacroGraph, build_graph
from m2flow.planners.base import Planner, check_cluster, device_kind, get_planner, placement_modes, register
from m2flow.planners.profile import Profile
from m2flow.schedule import Candidate, Plan


@register
class AutoPlanner(Planner):
    mode = "auto"

    def plan(self, graph: MacroGraph, cluster: Cluster, profile: Profile) -> Plan:
        check_cluster(graph, cluster)
        plans, rejected = [], []
        for overrides, layout_graph, layout_profile in process_layouts(graph, cluster, profile):
            for mode in placement_modes():
                try:
                    plan = get_planner(mode).plan(layout_graph, cluster, layout_profile)
                except PlanError as exc:
                    rejected.append(Candidate.infeasible(mode, str(exc), layout_label(layout_graph)))
                    continue
                plan.spec_overrides = overrides
                for row in plan.candidates:
                    row.layout = layout_label(layout_graph)
                plans.append(plan)
        if not plans:
            reasons = "\n".join(f"  - {r.reason}" for r in rejected)
            raise PlanError(f"placement.mode=auto: no placement fits this cluster:\n{reasons}")
        plans.sort(key=lambda p: p.predicted.iteration_s)
        best = plans[0]
        best.candidates = [row for p in plans for row in p.candidates] + rejected
        best.notes.insert(0, explain(plans))  # the decision first
        return best


def layout_label(graph: MacroGraph) -> str:
    """`processes x envs` of the loop's simulator, e.g. `4 x 2`."""
    if graph.loop is None:
        return "-"
    entry = graph.info[graph.loop.entry.worker]
    return f"{entry.replicas} x {entry.items_per_replica}"


def process_layouts(graph: MacroGraph, cluster: Cluster, profile: Profile):
    """The declared simulator layout, and with `placement.search_processes` every other split of the same
    envs into processes (a divisor of the total, at most one process per device of its kind)."""
    yield [], graph, profile
    loop = graph.loop
    if not graph.spec.placement.search_processes or loop is None:
        return
    name = loop.entry.worker
    entry = graph.info[name]
    if entry.items_field is None:
        return  # the worker declares no field for its items: its split cannot change
    total = entry.replicas * entry.items_per_replica
    devices = cluster.count(device_kind(graph, name, cluster))
    for processes in [d for d in range(1, min(total, devices) + 1) if total % d == 0 and d != entry.replicas]:
        overrides = [
            f"workers.{name}.replicas={processes}",
            f"workers.{name}.args.{entry.items_field}={total // processes}",
        ]
        try:
            spec = spec_from_dict(apply_overrides(copy.deepcopy(graph.spec.to_dict()), overrides, "search"))
            layout = build_graph(spec)
        except SpecError:
            continue  # another loop worker has more replicas than this many shards
        yield (
            overrides,
            layout,
            replace(profile, items_per_replica={**profile.items_per_replica, name: total // processes}),
        )


def explain(plans: list[Plan]) -> str:
    best = plans[0]
    layout = f", simulator {best.candidates[0].layout} (processes x envs)" if best.spec_overrides else ""
    line = (
        f"auto chose {best.mode} with {best.pipeline_stages} stage(s){layout}:"
        f" {best.predicted.iteration_s:.4g} s/iteration"
    )
    if len(plans) > 1:
        runner = plans[1]
        ratio = runner.predicted.iteration_s / best.predicted.iteration_s
        line += f"; next best {runner.mode} ({runner.pipeline_stages} stage(s)) is {ratio:.2f}x slower"
    return line
