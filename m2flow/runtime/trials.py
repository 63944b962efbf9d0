"""What a re-plan tries to measure (`replan.py`'s module doc: a *trial*): a plan that would be faster under an
assumption about what no run has measured, or one the measured costs cannot tell from the running plan, run for a
few iterations so that the next re-plan knows.

Two things no run may have measured decide between plans of other stage counts: how a loop port's cost splits
between per call and per env (one batch size cannot say), and what a port that ran beside rendering on its GPU
costs alone (`planners/render.py`): a plan of two stages or more measures it only so. A third decides between any
two plans: what the loop's messages cost in each (`execution_id`), which a run measures of its own plan only;
where another plan is predicted within `TIE` of the running one, that is the difference between them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from m2flow.cluster import Cluster
from m2flow.errors import PlanError
from m2flow.graph import MacroGraph
from m2flow.kinds import KINDS
from m2flow.planners import make_plan
from m2flow.planners.base import placement_modes, stage_options
from m2flow.planners.profile import Profile
from m2flow.planners.render import beside_rendering, ports_of
from m2flow.planners.simulate import sends_messages, simulate_plan
from m2flow.planners.trace_calls import port_of_key, rendering_key
from m2flow.schedule import Plan, stands_in
from m2flow.spec import PortCost

if TYPE_CHECKING:
    from m2flow.runtime.replan import Refit

TRIAL_GAIN = 0.05  # what a plan must be predicted to gain, under the assumption, to be tried
# a plan predicted within this of the running one's time is tried where no run measured its loop's messages: on the
# 2-core machine two runs of one plan differed by up to 25% (benchmarks/RESULTS.md, dec07b), a prediction by 10% no less
TIE = 0.10
# how much faster a port beside rendering on its GPU is assumed to run alone, until a run measures both: in a probe
# only (a CNN policy's act of 32 envs beside rendering took about 1.8x what one of 64 took alone, a ViT's about 1.0x;
# a camera step about 1.3x: benchmarks/results/gpu45, gpu48)
CONTENTION_PRIOR = 1.5


def tryable(graph: MacroGraph, candidate: Plan, current: Plan) -> bool:
    """Whether running `candidate` would measure the loop's ports at other batch sizes — other slices per replica
    — on the workers as they are (no knobs the planner sets, e.g. envs per replica, other than theirs: those need
    the run started again)."""
    return (
        _same_workers(candidate, current)
        and candidate.pipeline_stages != current.pipeline_stages
        and not (fixed_slices(graph))
    )


def _same_workers(candidate: Plan, current: Plan) -> bool:
    """Whether `candidate` runs the workers as `current` has them (no knob the planner sets otherwise)."""
    return not candidate.spec_overrides or candidate.spec_overrides == current.spec_overrides


def fixed_slices(graph: MacroGraph) -> list[str]:
    """The classes of sliced workers (a simulator: an instance per pipeline slice) whose saved state cannot follow
    a switch to other slices: they have a `state_dict` and no `reslice_states` to cut it otherwise."""
    return [
        info.spec.cls
        for info in graph.info.values()
        if KINDS[info.kind].slices and hasattr(info.target, "state_dict") and not hasattr(info.target, "reslice_states")
    ]


@dataclass(frozen=True)
class Probe:
    """A plan to try: what it would gain over the running one under an assumption about what no run measured, or as
    predicted where the prediction cannot tell (`_tie_probe`)."""

    gain: float  # under the assumption; negative where it is a tie the other way
    plan: Plan
    why: str  # what was not measured, the assumption and what it would gain, as the note says them


def best_probe(graph: MacroGraph, cluster: Cluster, current: Plan, measured: Refit) -> Probe | None:
    """The plan that would gain the most, if at least `TRIAL_GAIN`, under an assumption about what no run has
    measured: the unmeasured splits all per call, or all per item (a plan at other batch sizes: the one the measured
    costs favour by less than a switch needs among them), or the ports measured beside rendering only
    `CONTENTION_PRIOR` times as fast alone (a plan of one stage); else a plan predicted within `TIE` of the running
    one whose loop no run measured (`_tie_probe`)."""
    probes = [_split_probe(graph, cluster, current, measured, per_call) for per_call in (True, False)]
    probes.append(_alone_probe(graph, cluster, current, measured))
    probe = max(filter(None, probes), key=lambda p: p.gain, default=None)
    return probe if probe is not None and probe.gain >= TRIAL_GAIN else _tie_probe(graph, cluster, current, measured)


def _probe(graph: MacroGraph, cluster: Cluster, current: Plan, profile: Profile, unmeasured: str) -> Probe | None:
    """The best plan on `profile`, and its gain over `current` there, if running it would measure what it assumes."""
    try:
        candidate = make_plan(graph, cluster, profile)
    except PlanError:
        return None
    if not tryable(graph, candidate, current):
        return None
    current_s = simulate_plan(graph, current, profile).prediction.iteration_s
    gain = 1 - candidate.predicted.iteration_s / current_s
    return Probe(gain, candidate, f"{unmeasured}, {candidate.label} would be {gain:.0%} faster than {current.label}")


def _tie_probe(graph: MacroGraph, cluster: Cluster, current: Plan, measured: Refit) -> Probe | None:
    """The fastest plan, of the modes and stage counts the workflow allows, predicted within `TIE` of the running
    one and run on the workers as they are, but otherwise (`execution_id`), where its loop sends messages between
    processes and no run measured what they cost: the hop it is priced at is another execution's."""
    if fixed_slices(graph):
        return None
    profile = measured.profile
    current_s = simulate_plan(graph, current, profile).prediction.iteration_s
    rivals = [
        plan
        for plan in _plans(graph, cluster, profile)
        if plan.execution != current.execution
        and plan.execution not in profile.execution_hops
        and _same_workers(plan, current)
        and abs(plan.predicted.iteration_s / current_s - 1) <= TIE
        and sends_messages(graph, plan, profile)
    ]
    rival = min(rivals, key=lambda plan: plan.predicted.iteration_s, default=None)
    if rival is None:
        return None
    rival_s = rival.predicted.iteration_s
    why = (
        f"{rival.label} predicted {rival_s:.3g} s/iteration against {current_s:.3g} s, within {TIE:.0%}: the"
        " measured costs cannot tell them apart, and no run measured what its loop's messages cost"
    )
    return Probe(1 - rival_s / current_s, rival, why)


def _plans(graph: MacroGraph, cluster: Cluster, profile: Profile) -> Iterator[Plan]:
    """The best plan of each mode and stage count the workflow allows (`placement.mode`, `pipeline_stages`) that
    fits the cluster."""
    placement = graph.spec.placement
    modes = placement_modes() if placement.mode == "auto" else [placement.mode]
    for mode, stages in itertools.product(modes, stage_options(graph, profile)):
        try:
            yield make_plan(placed(graph, mode=mode, pipeline_stages=stages), cluster, profile)
        except PlanError:
            continue


def placed(graph: MacroGraph, **placement: object) -> MacroGraph:
    """`graph` with these `placement` settings (`mode`, `pipeline_stages`) in place of its own."""
    settings = graph.spec.placement.model_copy(update=placement)
    return replace(graph, spec=graph.spec.model_copy(update={"placement": settings}))


def _split_probe(graph: MacroGraph, cluster: Cluster, current: Plan, measured: Refit, per_call: bool) -> Probe | None:
    """Were the unmeasured splits all per call (or all per item), the plan to try."""
    if not measured.unsplit:
        return None
    split = "their cost per call" if per_call else "their cost per item"
    unmeasured = f"{', '.join(measured.unsplit)} measured at one batch size only; were {split}"
    return _probe(graph, cluster, current, _split(measured, per_call), unmeasured)


def _alone_probe(graph: MacroGraph, cluster: Cluster, current: Plan, measured: Refit) -> Probe | None:
    """Were the ports the running plan measured beside rendering only `CONTENTION_PRIOR` times faster where they
    do not run beside it (no run measured them so), the plan to try that runs none of them so: of one stage, or
    rendering on GPUs of their own (`planners/render.py`)."""
    running_beside = ports_of(beside_rendering(graph, current.placements, current.pipeline_stages, cluster))
    profile = measured.profile.copy()
    only_beside = sorted(
        port for port in running_beside if rendering_key(port) in measured.fitted and stands_in(profile.source[port])
    )
    if not only_beside:
        return None
    for port in only_beside:
        cost = profile.costs[port]
        profile.costs[port] = PortCost(
            fixed_s=cost.fixed_s / CONTENTION_PRIOR, per_item_s=cost.per_item_s / CONTENTION_PRIOR
        )
    unmeasured = (
        f"{', '.join(only_beside)} measured only beside rendering on their GPU; were they {CONTENTION_PRIOR:g}x as fast"
        " where they do not run beside it"
    )
    probe = _probe(graph, cluster, current, profile, unmeasured)
    if probe is None:
        return None
    again = ports_of(beside_rendering(graph, probe.plan.placements, probe.plan.pipeline_stages, cluster))
    return None if again & set(only_beside) else probe  # not one that measures them beside rendering again


def _split(measured: Refit, per_call: bool) -> Profile:
    """The refit profile with each unsplit port's measured cost all per call, or all per item (where it was measured
    beside rendering only, the port's cost elsewhere too, which that stands for)."""
    profile = measured.profile.copy()
    for port in measured.unsplit:
        size = measured.fitted[port].by_size[0]
        per_item_s = 0.0 if per_call else size.mean_s / size.items
        cost = PortCost(fixed_s=size.mean_s - per_item_s * size.items, per_item_s=per_item_s)
        alone = port_of_key(port)
        for key in (port, alone) if stands_in(profile.source[alone]) else (port,):
            profile.costs[key] = cost
    return profile
