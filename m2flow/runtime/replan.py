"""Calibration and online re-planning: refit the profile from the run's own trace, plan again, switch if
clearly better, and keep what was measured for the next runs.

An asynchronous flow is calibrated on its synchronous twin (`synchronous_twin`): with training beside the loop
the ports share devices, and what a trace shows is not a port's own cost. Its first iterations run
synchronously (staleness 0, within any bound) on the placement the plan chose; the re-plan then plans the
asynchronous flow from what they measured.

Between iterations, after the first traced ones (the first warms up: a port called there alone, such as an
evaluation every k iterations, is priced from those calls for the re-plan, not cached), the measured port costs
replace every other source — declared ones too: what the run measured beats what was written down; a port seen at
one batch size keeps the split between per-call and per-item cost that `m2flow profile` (at two sizes or more) or
earlier runs measured, or else its prior's: a GPU's (mostly per call at small batches) where its work ran on one, a
policy placed there or a simulator's cameras rendered there (`planners/profile.py`). The planner plans again in the
workflow's mode; the run moves to the new plan only if it is predicted at least `REPLAN_GAIN` faster than the
current one under the same refit profile.

A split no run has measured can decide the plan: a GPU renders half the envs in about the time it renders
all of them, a core steps them in half the time. Where a plan at other batch sizes would be at least
`TRIAL_GAIN` faster were such a split the other way (all per call, or all per item), and the run is long
enough, the run tries that plan for `REPLAN_AFTER` iterations (a *trial*) — the probe that measures the
split — and its next re-plan, the costs now measured at both sizes, goes back to the plan it tried from if that
is predicted `BACK_GAIN` faster (another plan needs `REPLAN_GAIN`, as ever). A trial costs its iterations at the
tried plan's speed and a restart of the workers each way (with a checkpoint). A plan of one stage is tried so too
where the running plan measured ports only beside rendering on their GPU (`planners/render.py`), were they
`CONTENTION_PRIOR` times as fast alone; and a plan predicted within `TIE` of the running one where no run measured
what its loop's messages cost (the hop `calibrate_run` fits, kept per execution: `schedule.execution_id`); what
decides a trial is in `trials.py`.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace

from m2flow.cluster import Cluster
from m2flow.errors import PlanError
from m2flow.graph import MacroGraph
from m2flow.planners import device_kinds, make_plan, profile_of
from m2flow.planners.cache import EXECUTION_HOP, CachedFit, cached_fits, save_cached, save_calibration
from m2flow.planners.fit import PortFit, fit_points, latest_shares, merged
from m2flow.planners.merging import MERGE_NOTE, merge_notes, merge_slices
from m2flow.planners.profile import Profile, ports_on_gpu
from m2flow.planners.render import beside_rendering, ports_of
from m2flow.planners.run_level import RunTotals, at_run_level
from m2flow.planners.simulate import sends_messages, simulate_plan
from m2flow.planners.trace_calls import controller_seconds, points_from_trace, port_of_key, replica_points
from m2flow.program import build_phases
from m2flow.runtime.trials import best_probe, fixed_slices, placed
from m2flow.schedule import Plan, Prediction, unknown_costs

REPLAN_GAIN = 0.10
BACK_GAIN = 0.02  # what the plan a trial left must be predicted to gain over it to go back (a restart)
REPLAN_AFTER = 3  # iterations traced before re-planning: the first warms up, the others are measured
TRIAL_LEFT = 2 * REPLAN_AFTER  # iterations a run needs left to try a plan: to measure it, then to use what it learnt
MAX_REPLANS = 2  # a switch (or a trial) runs other batch sizes: the second re-plan decides on them too
MEASURED = "measured (this run)"  # the source of a cost this run measured
MAX_HOP_ITEM_S = 1e-3  # each item of a loop message between processes costs at most this (measured: 20-130 us)
MAX_BESIDE_SLOWDOWN = 4.0  # work on a device the loop and training share takes at most this much longer
BESIDE_NOISE = 0.05  # an iteration within this much of its prediction without a slowdown shows none


@dataclass
class Refit:
    profile: Profile
    fitted: dict[str, PortFit]  # worker.port -> its fit to this run's calls
    unsplit: list[str] = field(default_factory=list)  # loop ports whose per-call part no run has measured
    # hop_item_s (also as the running execution's, `EXECUTION_HOP`), controller_s: those the trace could say
    calibrated: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Running:
    """The plan the workers run, since which iteration (that one warmed up)."""

    plan: Plan
    since: int
    warmups: tuple[int, ...] = ()  # the first iteration of each start of the workers (a switch, a restart)
    tried_from: Plan | None = None  # the plan a trial left (module doc)


def refit(
    graph: MacroGraph, cluster: Cluster, events: list[dict], running: Running, warm_up_alone: bool = True
) -> Refit:
    """The profile with every port seen in `events` (run by `running`) set to its fitted cost, what a message between
    processes costs per item and the controller's own time per iteration (`calibrate_run`); `warm_up_alone`: a port
    called in a warm-up iteration alone so far too, from those calls (a re-plan's; never what is cached)."""
    profile = profile_of(graph, cluster)
    trace = {"traceEvents": events}
    warmups = running.warmups
    points = points_from_trace(trace, skip_iterations=1, warmups=warmups)
    if warm_up_alone:  # e.g. an evaluation every k iterations, run in the first: its calls there, which may run slow
        warm_up = points_from_trace(trace, skip_iterations=0)
        points |= {port: calls for port, calls in warm_up.items() if port not in points}
    cached = {port: entry.fit for port, entry in cached_fits(graph, device_kinds(graph, cluster)).items()}
    on_gpu = ports_on_gpu(graph, running.plan)
    priors = {
        port: _per_call_fraction(profile, port, samples, cached.get(port), port_of_key(port) in on_gpu)
        for port, samples in points.items()
    }
    by_replica = replica_points(trace, _replica_counts(graph, running), skip_iterations=1, warmups=warmups)
    fitted = fit_points(points, "online", priors, by_replica)["ports"]  # this run's alone: the hop is calibrated on it
    unsplit = _unsplit(graph, profile, fitted, cached)
    for port, fit in fitted.items():
        if port_of_key(port) in profile.costs:  # the shares at other replica counts earlier runs measured stay
            profile.set_seen(port, replace(fit, replica_shares=latest_shares(cached.get(port), fit)), MEASURED)
            profile.split_measured.discard(port)  # this run's line, whatever `m2flow profile` measured
    calibrated = calibrate_run(graph, running, profile, trace)
    return Refit(profile, fitted, unsplit, calibrated)


def _replica_counts(graph: MacroGraph, running: Running) -> dict[str, int]:
    """How many replicas of each worker ran: as the running plan placed them, else as the workflow has them."""
    placed = running.plan.placements
    return {
        name: len(placed[name].replica_devices) if name in placed else info.replicas
        for name, info in graph.info.items()
    }


def _per_call_fraction(
    profile: Profile, port: str, samples: list[tuple[float, float]], cached: PortFit | None, on_gpu: bool
) -> float:
    """The per-call part of `port`'s cost at this run's mean batch size, should this run see one size only: as
    the line through this run's mean and the sizes earlier runs measured, where they measured another size;
    otherwise as the profile has it, on a GPU where its work ran on one (`Profile.per_call_fraction`)."""
    items = sum(x for x, _ in samples) / len(samples)
    line = merged(cached, fit_points({port: samples}, "online")["ports"][port])
    if len(line.batch_sizes) < 2:
        return profile.per_call_fraction(port, items, on_gpu)
    total = line.fixed_s + line.per_item_s * items
    return line.fixed_s / total if total > 0 else 1.0


def _unsplit(graph: MacroGraph, profile: Profile, fitted: dict[str, PortFit], cached: dict[str, PortFit]) -> list[str]:
    """The loop's ports (their batch sizes follow the plan's slices) that this run measured at one batch size, and
    neither `m2flow profile` at two sizes or more nor earlier runs at another."""
    loop = {str(p) for p in graph.loop.ports} if graph.loop else set()
    return [
        port
        for port, fit in fitted.items()
        if port_of_key(port) in loop
        and len(fit.batch_sizes) == 1
        and fit.batch_sizes[0] > 0
        and port_of_key(port) not in profile.split_measured
        and (port not in cached or set(cached[port].batch_sizes) <= set(fit.batch_sizes))
    ]


def beside_slowdown(graph: MacroGraph, cluster: Cluster, plan: Plan, iteration_s: float) -> float | None:
    """How much longer work took on a device that the loop and training beside it both load (`flow.async`) than
    the costs the run cached say it takes alone: the `Profile.beside_slowdown` that makes `plan`'s predicted
    iteration what an asynchronous segment measured (`iteration_s`); 1.0 where the iteration came within
    `BESIDE_NOISE` of the prediction without one (read from less, it is noise, and it steers the plans of other
    slices: benchmarks/RESULTS.md, "the slowdown of sharing the GPU"). None where it cannot be read: a cost is
    not measured, or no such device bounds the plan's iteration."""
    profile = profile_of(graph, cluster)
    if unknown_costs(profile.source):
        return None

    def predicted(slowdown: float) -> float:
        profile.beside_slowdown = slowdown
        return simulate_plan(graph, plan, profile).prediction.iteration_s

    low, high = 1.0, MAX_BESIDE_SLOWDOWN
    if predicted(1.0 + BESIDE_NOISE) <= predicted(low):
        return None  # no such device bounds the iteration as predicted: the time says nothing of the slowdown
    if predicted(low) * (1 + BESIDE_NOISE) >= iteration_s:
        return 1.0
    for _ in range(24):  # the predicted iteration grows with the slowdown: bisect to the measured one
        middle = (low + high) / 2
        low, high = (middle, high) if predicted(middle) < iteration_s else (low, middle)
    return (low + high) / 2


def calibrate_run(graph: MacroGraph, running: Running, profile: Profile, trace: dict) -> dict[str, float]:
    """What per-port costs leave out, from how long the running plan's loop and iterations took: what a message
    between processes costs per item it carries, on top of its per-message hop (the `hop_item_s` that makes the
    predicted loop match the measured one), and the controller's own time per iteration. Sets them in `profile`
    and returns those the trace could say (no hop where the loop sends no message between processes, where it
    took less than its messages' per-message hops alone predict or more than any cost per item explains, or where
    no loop was traced). The hop is the plan's execution's (`execution_id`: plans run otherwise measured
    other hops, benchmarks/RESULTS.md, hop_by_plan) and every other's until a run of that one measures its own."""
    plan = running.plan
    hops, execution = profile.execution_hops, plan.execution
    prior = hops.pop(execution, None)

    def predicted() -> Prediction:
        return simulate_plan(graph, plan, profile).prediction

    def loop_s(hop_item_s: float) -> float:
        hops[execution] = hop_item_s
        return predicted().phase_s["loop"]

    calibrated, fitted = {}, None
    loops = controller_seconds(trace, "loop", running.since + 1)
    if loops and sends_messages(graph, plan, profile):  # else the loop's time says nothing of a hop
        measured, low, high = statistics.median(loops), 0.0, MAX_HOP_ITEM_S
        for _ in range(24):  # the loop's predicted time grows with the hop's cost: bisect to the measured one
            middle = (low + high) / 2
            low, high = (middle, high) if loop_s(middle) < measured else (low, middle)
        # not where the loop took less than its messages cost with nothing per item, or more than any such cost
        fitted = hops[execution] if low > 0.0 and high < MAX_HOP_ITEM_S else None
    hops.pop(execution, None)
    if fitted is not None:
        hops[execution] = profile.hop_item_s = calibrated["hop_item_s"] = calibrated[EXECUTION_HOP + execution] = fitted
    elif prior is not None:
        hops[execution] = prior
    iterations = controller_seconds(trace, "iteration", running.since + 1)
    if iterations:
        profile.controller_s = 0.0
        profile.controller_s = max(0.0, statistics.median(iterations) - predicted().iteration_s)
        calibrated["controller_s"] = profile.controller_s
    return calibrated


@dataclass(frozen=True)
class Calibration:
    """How a run measures its costs: how many re-plans it may make after its first iterations (0: none), the
    graph those iterations run (an asynchronous flow's synchronous twin, or None: the workflow's own), and what
    it says about it."""

    replans: int
    twin: MacroGraph | None
    says: list[str]


def calibration(graph: MacroGraph, unknown: list[str], iterations_left: int) -> Calibration:
    """`placement.replan`: auto re-plans when a cost is unknown, true always, false never; an asynchronous flow
    measures on its synchronous twin, if the run has iterations left after measuring."""
    spec = graph.spec
    if not (spec.placement.replan is True or (spec.placement.replan == "auto" and unknown)):
        return Calibration(0, None, [])
    what = f"{len(unknown)} port cost(s) unknown ({', '.join(unknown)})" if unknown else "placement.replan: true"
    measuring = f"m2flow: {what}: measuring the costs in the first {REPLAN_AFTER} iterations, then re-planning"
    if spec.flow.asynchronous is None:
        if iterations_left <= REPLAN_AFTER:  # still traced as if it would re-plan: the costs are cached at the end
            short = (
                f"m2flow: {what}: measuring the costs in this run's {iterations_left} iteration(s), too few to re-plan"
                f" after {REPLAN_AFTER}; they are cached for the next runs and `m2flow plan`"
            )
            return Calibration(MAX_REPLANS, None, [short])
        return Calibration(MAX_REPLANS, None, [measuring])
    if iterations_left <= REPLAN_AFTER + 1:  # the first asynchronous iteration warms up: none would be measured
        too_short = (
            f"m2flow: flow.async, {what}: {REPLAN_AFTER} synchronous iterations would measure the costs, but this run"
            " has too few after them: it runs asynchronously on the plan as it is (costs not measured, not cached)"
        )
        return Calibration(0, None, [too_short])
    synchronously = f"{measuring}; they run synchronously (training beside the loop would skew them)"
    return Calibration(1, synchronous_twin(graph), [synchronously])


def synchronous_twin(graph: MacroGraph) -> MacroGraph:
    """The same workflow without `flow.async`: what an asynchronous flow's calibration iterations run."""
    flow = graph.spec.flow.model_copy(update={"asynchronous": None})
    return replace(graph, spec=graph.spec.model_copy(update={"flow": flow}))


def with_phases_of(plan: Plan, graph: MacroGraph) -> Plan:
    """The same placement running `graph`'s phases: an asynchronous plan as its synchronous twin runs it, and
    back. Neither swaps a worker out (an asynchronous flow never does) nor streams its then-edges (an
    asynchronous one does not, so the twin measures training as it will run)."""
    return replace(plan, phases=[replace(phase, streamed=[]) for phase in build_phases(graph)])


def remember_beside(
    graph: MacroGraph, cluster: Cluster, plan: Plan, iterations_s: list[float], run: str | None = None
) -> str | None:
    """Cache how much slower the work an asynchronous segment shared a device with ran (`beside_slowdown`), for
    the next runs and `m2flow plan`, as run `run` measured it (`planners.cache`); what to say of it, if it could be
    read."""
    slowdown = beside_slowdown(graph, cluster, plan, statistics.median(iterations_s)) if iterations_s else None
    if slowdown is None:
        return None
    save_calibration(graph, {"beside_slowdown": slowdown}, run)
    return (
        f"m2flow: flow.async: work on a device the loop and training share took {slowdown:.2f}x its time alone"
        " (what makes the plan predict the iterations measured); cached for the next runs and `m2flow plan`"
    )


def remember(
    graph: MacroGraph,
    cluster: Cluster,
    events: list[dict],
    running: Running,
    measured_on: MacroGraph | None = None,
    run: str | None = None,
    totals: RunTotals | None = None,
) -> dict[str, CachedFit]:
    """Cache what this run measured, for `m2flow plan` and the next runs of the same workers; `measured_on`: the
    graph the measured iterations ran, if not `graph` (an asynchronous flow's synchronous twin); `run`: the run's
    id in the cache, so that its saves at a re-plan and at its end count once (`planners.cache`); `totals`: each
    port's seconds over every iteration the running workers measured, to set the loop's fits, traced call by call
    in a few iterations, to the whole run's level (`planners/run_level.py`). Returns what the cache now holds of the
    ports this run measured."""
    # a warm-up's calls compile, capture and allocate: no run's cost for the next runs
    measured = refit(measured_on or graph, cluster, events, running, warm_up_alone=False)
    if not measured.fitted:
        return {}
    fitted = at_run_level(measured.fitted, events, totals) if totals is not None else measured.fitted
    kinds = device_kinds(graph, cluster)
    save_cached(graph, kinds, fitted, run)
    if measured.calibrated:  # what the trace said: a hop or time it could not say is not a run's value
        save_calibration(graph, measured.calibrated, run)
    return {port: cached for port, cached in cached_fits(graph, kinds).items() if port in fitted}


@dataclass
class Decision:
    plan: Plan  # what runs from now on: the better plan, or the current one predicted with the measured costs
    switched: bool
    why: str
    trial: bool = False  # the plan switched to runs to measure what no run has (`trials.py`)


def replan(
    graph: MacroGraph,
    cluster: Cluster,
    running: Running,
    events: list[dict],
    measured_on: MacroGraph | None = None,
    may_try: bool = False,
) -> Decision:
    """Plan `graph` again on the measured costs; switch only for a clear gain (after a trial, for any gain), or
    try a plan to measure what decides it when `may_try` (another re-plan follows with iterations to measure
    it). The reason is logged either way. `measured_on`: the graph the measured iterations ran, if not `graph`
    (an asynchronous flow's synchronous twin)."""
    current = running.plan if measured_on is None else with_phases_of(running.plan, graph)
    measured = refit(measured_on or graph, cluster, events, running)
    profile = measured.profile
    simulated = simulate_plan(graph, current, profile)
    now, tasks = simulated.prediction, simulated.tasks()
    beside = beside_rendering(graph, current.placements, current.pipeline_stages, cluster)
    now.cost_sources = profile.sources_in(beside)
    merged = _merging_on(graph, current, profile, ports_of(beside))  # as `now` predicts it, on the measured costs
    fixed = fixed_slices(graph)
    try:  # a simulator whose saved state cannot follow other slices keeps its stages (it says why below)
        best = make_plan(placed(graph, pipeline_stages=current.pipeline_stages) if fixed else graph, cluster, profile)
    except PlanError as exc:  # e.g. a sync transport the workflow asks for that the better layout cannot carry
        why = f"replan: keeping {current.label}: the best alternative is refused: {exc}"
        return Decision(replace(merged, predicted=now, tasks=tasks), False, why)
    now_s, new_s = now.iteration_s, best.predicted.iteration_s
    same = best.layout_key == current.layout_key
    back = running.tried_from is not None and best.layout_key == running.tried_from.layout_key
    if same or new_s > now_s * (1 - (BACK_GAIN if back else REPLAN_GAIN)):
        probe = best_probe(graph, cluster, current, measured) if may_try else None
        if probe is not None:
            why = (
                f"replan: trying {probe.plan.label} for {REPLAN_AFTER} iterations: {probe.why}; the next re-plan"
                " keeps the faster"
            )
            return Decision(probe.plan, True, why, trial=True)
        kept = replace(merged, predicted=now, tasks=tasks)
        rival = "still the best plan" if same else f"the best alternative {best.label} {new_s:.3g} s"
        predicted = f"with the measured costs it is predicted {now_s:.3g} s/iteration"
        why = f"replan: keeping {current.label}: {predicted}, {rival}"
        if fixed:
            why += f" at {current.pipeline_stages} stage(s): {', '.join(fixed)} cannot cut its saved state otherwise"
        return Decision(kept, False, why)
    why = (
        f"replan: switching {current.label} -> {best.label}: with the measured costs {now_s:.3g} ->"
        f" {new_s:.3g} s/iteration ({now_s / new_s:.2f}x)"
    )
    return Decision(best, True, why)


def _merging_on(graph: MacroGraph, plan: Plan, profile: Profile, beside: frozenset[str]) -> Plan:
    """`plan` merging the slices `profile`'s costs say to, its notes saying so (`planners/merging.py`)."""
    stages = plan.pipeline_stages
    merging = merge_notes(graph, profile, stages, beside)
    notes = [note for note in plan.notes if not note.startswith(MERGE_NOTE)] + merging
    return replace(plan, merge_slices=merge_slices(graph, profile, stages, beside), notes=notes)
