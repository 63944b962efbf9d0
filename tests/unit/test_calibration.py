"""Calibration from a run's own trace: fits with a prior, the message hop and the controller's time
recovered from how long the loop and the iterations took, and what a run caches of them (the cache's own rules:
`test_cost_cache.py`)."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from m2flow.cluster import Cluster
from m2flow.config import spec_from_dict
from m2flow.graph import build_graph
from m2flow.planners import device_kinds, make_plan, profile_of
from m2flow.planners.cache import (
    EXECUTION_HOP,
    EXECUTIONS_KEPT,
    cached_fits,
    load_cached,
    load_calibration,
    save_cached,
    save_calibration,
)
from m2flow.planners.fit import PortFit, SizeMean, fit_line, residual
from m2flow.planners.profile import CHANNEL_HOP_S, HOP_ITEM_S
from m2flow.planners.run_level import RunTotals, at_run_level
from m2flow.planners.simulate import sends_messages, simulate_plan
from m2flow.planners.trace_calls import STARTED
from m2flow.runtime.replan import MEASURED, Running, calibrate_run, refit, remember, replan
from m2flow.schedule import Plan
from m2flow.viz.tables import cached_costs_table
from tests.unit.test_cost_cache import cached_step_fit, save_step_cost
from tests.unit.test_planner import workflow
from tests.unit.test_symmetry import spin_workflow
from tests.unit.test_trials import loop_calls, per_item, unmeasured


def test_one_batch_size_splits_by_the_prior():
    fit = fit_line([(4, 0.004), (4, 0.004)], prior_fixed=0.25)
    assert fit.fixed_s == pytest.approx(0.001) and fit.per_item_s == pytest.approx(0.00075)


def controller_event(name: str, iteration: int, seconds: float) -> dict:
    cat = "iteration" if name == "iteration" else "phase"
    return {"ph": "X", "name": name, "cat": cat, "ts": 0, "dur": seconds * 1e6, "args": {"iteration": iteration}}


def test_the_hop_per_item_and_the_controller_time_are_what_make_the_prediction_match_the_run():
    graph = build_graph(spec_from_dict(workflow(cpus=2, mode="hybrid", stages=2)))
    cluster = Cluster.from_spec(graph.spec.cluster)
    plan = make_plan(graph, cluster)
    truth = profile_of(graph, cluster)
    truth.hop_item_s, truth.controller_s = 0.0005, 0.05
    measured = simulate_plan(graph, plan, truth).prediction
    trace = {
        "traceEvents": [
            controller_event(name, it, seconds)
            for it in range(4)
            for name, seconds in (("loop", measured.phase_s["loop"]), ("iteration", measured.iteration_s))
        ]
    }
    profile = profile_of(graph, cluster)
    calibrated = calibrate_run(graph, Running(plan, since=0), profile, trace)
    own = EXECUTION_HOP + plan.execution  # what this plan's messages cost, kept apart from other plans'
    assert calibrated == {
        "hop_item_s": profile.hop_item_s,
        own: profile.hop_item_s,
        "controller_s": profile.controller_s,
    }
    assert profile.execution_hops == {plan.execution: profile.hop_item_s}
    assert profile.hop_item_s == pytest.approx(0.0005, rel=1e-3)
    assert profile.hop_s == truth.hop_s  # the per-message part keeps its prior: the per-item part takes the rest
    assert profile.controller_s == pytest.approx(0.05, rel=1e-3)


def test_a_plans_messages_cost_what_a_run_of_its_execution_measured_and_other_plans_the_workflows_hop():
    graph = build_graph(spec_from_dict(workflow(cpus=2, mode="hybrid", stages=2)))
    cluster = Cluster.from_spec(graph.spec.cluster)
    two = make_plan(graph, cluster)
    four = make_plan(build_graph(spec_from_dict(workflow(cpus=2, mode="hybrid", stages=4))), cluster)
    profile = profile_of(graph, cluster)
    before = {
        plan.pipeline_stages: simulate_plan(graph, plan, profile).prediction.phase_s["loop"] for plan in (two, four)
    }
    profile.execution_hops[two.execution] = 5e-4  # a run of two stages measured its messages dearer
    after = {
        plan.pipeline_stages: simulate_plan(graph, plan, profile).prediction.phase_s["loop"] for plan in (two, four)
    }
    assert after[2] > before[2] * 1.05
    assert after[4] == before[4]  # another execution: the workflow's hop, as before


def test_co_hosting_makes_another_execution_a_saved_plan_the_same_one_and_only_messages_between_processes_count():
    raw = workflow(env_s=1e-4, policy_s=1e-4, cpus=1, mode="shared")
    raw["placement"]["colocate"] = True
    hosted_graph = build_graph(spec_from_dict(raw))
    hosted = make_plan(hosted_graph, Cluster.from_spec(hosted_graph.spec.cluster))
    raw["placement"]["colocate"] = False
    alone_graph = build_graph(spec_from_dict(raw))
    alone = make_plan(alone_graph, Cluster.from_spec(alone_graph.spec.cluster))
    assert hosted.processes and not alone.processes and hosted.placements == alone.placements
    assert Plan.from_dict(hosted.to_dict()).execution == hosted.execution != alone.execution
    assert not sends_messages(hosted_graph, hosted, profile_of(hosted_graph, hosted.cluster))  # one process
    assert sends_messages(alone_graph, alone, profile_of(alone_graph, alone.cluster))


@pytest.mark.parametrize("loop_times_predicted", [0.5, 1e4])
def test_a_loop_no_cost_per_item_explains_leaves_the_cost_per_item_as_it_was(loop_times_predicted):
    # faster than its messages' per-message hops alone, or slower than any cost per item makes it
    graph = build_graph(spec_from_dict(workflow(cpus=2, mode="hybrid", stages=2)))
    cluster = Cluster.from_spec(graph.spec.cluster)
    plan = make_plan(graph, cluster)
    loop_s = loop_times_predicted * plan.predicted.phase_s["loop"]
    profile = profile_of(graph, cluster)
    profile.hop_item_s = 2e-6
    profile.execution_hops[plan.execution] = 3e-6  # what an earlier run of this plan measured
    calibrated = calibrate_run(
        graph,
        Running(plan, since=0),
        profile,
        {"traceEvents": [controller_event("loop", it, loop_s) for it in range(4)]},
    )
    assert calibrated == {}  # no hop, and no iteration traced to time the controller by
    assert profile.hop_item_s == 2e-6  # not where the bisection stopped, which the re-plan would plan from
    assert profile.execution_hops == {plan.execution: 3e-6}  # nor the plan's own


def test_a_co_hosted_loop_says_nothing_about_the_hop_so_the_hop_keeps_its_prior():
    raw = workflow(env_s=1e-4, policy_s=1e-4, cpus=1, mode="shared")
    raw["placement"]["colocate"] = True
    graph = build_graph(spec_from_dict(raw))
    cluster = Cluster.from_spec(graph.spec.cluster)
    plan = make_plan(graph, cluster)
    assert plan.processes  # env and policy share a process: no message between processes in the loop
    slow = [controller_event("loop", it, 10 * plan.predicted.phase_s["loop"]) for it in range(4)]
    profile = profile_of(graph, cluster)
    prior = profile.hop_item_s
    calibrated = calibrate_run(graph, Running(plan, since=0), profile, {"traceEvents": slow})
    assert profile.hop_item_s == prior  # not the bisection's bound, which would price every pipelined plan out
    assert calibrated == {}  # nor cached as measured: it would outvote the runs that measured one
    assert profile.execution_hops == {}


def test_a_co_hosted_run_caches_its_measured_costs_and_controller_time_but_no_hop(tmp_path, monkeypatch):
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(tmp_path))
    raw = workflow(env_s=1e-4, policy_s=1e-4, cpus=1, mode="shared")
    raw["placement"]["colocate"] = True
    graph = build_graph(spec_from_dict(raw))
    cluster = Cluster.from_spec(graph.spec.cluster)
    plan = make_plan(graph, cluster)
    step = {"ph": "X", "name": "step", "cat": "loop", "ts": 0, "dur": 400, "args": {"worker": "env[0]", "items": 4}}
    events = [
        event
        for it in range(1, 4)
        for event in (
            {**step, "args": {**step["args"], "iteration": it}},
            controller_event("loop", it, 10 * plan.predicted.phase_s["loop"]),
            controller_event("iteration", it, 10 * plan.predicted.iteration_s),
        )
    ]
    cached = remember(graph, cluster, events, Running(plan, since=0), run="a co-hosted run")
    assert cached["env.step"].fit.by_size == (SizeMean(4, pytest.approx(4e-4), 3),)
    assert set(load_calibration(graph)) == {"controller_s"}  # no prior hop cached as if this run measured it


def test_a_loop_port_is_cached_at_the_level_its_whole_run_measured_in_the_shape_its_traced_calls_gave(
    tmp_path, monkeypatch
):
    """A run traces its loop call by call in its first iterations only: here iterations 1-2 (0 warms up) step in
    5 ms, while over its 10 measured iterations a step took 4 ms on average (`RunTotals`, the controller's). The
    cached step costs 4 ms, its split between the per-call and per-item parts as its calls gave it; the act, which
    took the same over the run as in its traced calls, as they were; a run whose every measured iteration was
    traced call by call, as its calls were."""
    graph = build_graph(spec_from_dict(spin_workflow(1, 1, cpus=2, mode="hybrid", stages=1, trainers=1)))
    cluster = Cluster.from_spec(graph.spec.cluster)
    plan = make_plan(graph, cluster)
    events = loop_calls(range(3), 1, lambda envs: 0.005)  # per iteration 5 steps of 5 ms and 5 acts of 2 ms
    totals = RunTotals({"env.step": 10 * 5 * 0.004, "policy.act": 10 * 5 * 0.002}, frozenset(range(1, 11)))
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(tmp_path / "traced calls alone"))
    alone = remember(graph, cluster, events, Running(plan, since=0), run="a run")
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(tmp_path / "at the whole run's level"))
    leveled = remember(graph, cluster, events, Running(plan, since=0), run="a run", totals=totals)
    assert alone["env.step"].fit.by_size == (SizeMean(8, pytest.approx(0.005), 10),)
    assert leveled["env.step"].fit.by_size == (SizeMean(8, pytest.approx(0.004), 10),)
    step, step_alone = leveled["env.step"].fit, alone["env.step"].fit
    assert step.fixed_s == pytest.approx(0.8 * step_alone.fixed_s) and step_alone.fixed_s > 0
    assert step.per_item_s == pytest.approx(0.8 * step_alone.per_item_s) and step_alone.per_item_s > 0
    assert leveled["policy.act"].fit.by_size == (SizeMean(8, pytest.approx(0.002), 10),)
    fits = {port: entry.fit for port, entry in alone.items()}
    every_one_traced = RunTotals({"env.step": 2 * 5 * 0.004}, frozenset({1, 2}))
    assert at_run_level(fits, events, every_one_traced) == fits


def test_a_restart_s_workers_level_a_loop_port_by_their_own_traced_calls_not_also_by_those_before_the_restart():
    """Restarted from a checkpoint, the workers run (and trace) iterations 1-2 again: the level is read from their
    calls alone (2 ms steps), not from both attempts' added up."""
    before = loop_calls(range(3), 1, lambda envs: 0.005)
    restart = {"ph": "i", "name": "workers started: hybrid S=1", "cat": STARTED, "args": {"iteration": 0}}
    events = [*before, restart, *loop_calls(range(3), 1, lambda envs: 0.002)]
    fit = PortFit(fixed_s=0.0, per_item_s=0.0005, calls=10, batch_sizes=(8,), by_size=(SizeMean(8, 0.004, 10),))
    totals = RunTotals({"env.step": 10 * 5 * 0.004}, frozenset(range(1, 11)))
    leveled = at_run_level({"env.step": fit}, events, totals)["env.step"]
    assert leveled.by_size[0].mean_s == pytest.approx(0.008)  # 4 ms over the run, 2 ms in the traced calls: 2x


def test_a_damaged_calibration_entry_falls_back_to_its_values_instead_of_failing_the_save(tmp_path, monkeypatch):
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(tmp_path))
    graph = build_graph(spec_from_dict(workflow()))
    save_calibration(graph, {"hop_item_s": 0.0002, "controller_s": 0.01})
    (path,) = tmp_path.glob("workflow-*.json")
    entry = json.loads(path.read_text())
    path.write_text(json.dumps({**entry, "seen": {**entry["seen"], "hop_item_s": "damaged", "controller_s": [None]}}))
    save_calibration(graph, {"controller_s": 0.02})  # a run that measured no hop
    assert load_calibration(graph) == {"hop_item_s": 0.0002, "controller_s": pytest.approx(0.015)}


def test_cached_costs_are_used_where_nothing_is_declared():
    raw = workflow()
    del raw["workers"]["env"]["profile"]
    graph = build_graph(spec_from_dict(raw))
    cluster = Cluster.from_spec(graph.spec.cluster)
    assert profile_of(graph, cluster).source["env.step"] == "default"
    kinds = {"env": "cpu", "policy": "cpu", "learner": "cpu"}
    save_cached(
        graph,
        kinds,
        {"env.step": PortFit(fixed_s=0.001, per_item_s=0.0002), "policy.act": PortFit(fixed_s=9.0, per_item_s=0)},
    )
    assert load_cached(graph, kinds)["env.step"].per_item_s == 0.0002
    profile = profile_of(graph, cluster)
    assert profile.source["env.step"] == "cached" and profile.costs["env.step"].fixed_s == 0.001
    assert profile.source["policy.act"] == "declared"  # what the workflow declares wins over the cache
    assert make_plan(graph, cluster).predicted.cost_sources["env.step"] == "cached"


def test_the_cached_hop_is_the_median_of_the_runs_that_measured_it(tmp_path, monkeypatch):
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(tmp_path))
    graph = build_graph(spec_from_dict(workflow()))
    for hop_item_s in (0.0002, 0.0002, 0.0009):
        save_calibration(graph, {"hop_item_s": hop_item_s, "controller_s": 0.01})
    assert load_calibration(graph) == {"hop_item_s": pytest.approx(0.0002), "controller_s": pytest.approx(0.01)}
    cluster = Cluster.from_spec(graph.spec.cluster)
    assert profile_of(graph, cluster).hop_item_s == pytest.approx(0.0002)


def test_the_calibration_keeps_the_hops_of_the_executions_the_latest_runs_saved(tmp_path, monkeypatch):
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(tmp_path))
    graph = build_graph(spec_from_dict(workflow()))
    save_calibration(graph, {"hop_item_s": 0.0002, EXECUTION_HOP + "first": 0.0001})
    for n in range(EXECUTIONS_KEPT - 1):
        save_calibration(graph, {EXECUTION_HOP + f"plan {n}": 1e-5 * (n + 1)})
    save_calibration(graph, {EXECUTION_HOP + "first": 0.0003})  # run again: among the latest
    save_calibration(graph, {EXECUTION_HOP + "another": 0.0004})  # one more than kept: the oldest goes
    kept = load_calibration(graph)
    executions = [key.removeprefix(EXECUTION_HOP) for key in kept if key.startswith(EXECUTION_HOP)]
    assert len(executions) == EXECUTIONS_KEPT and executions[-2:] == ["first", "another"]
    assert "plan 0" not in executions and "plan 1" in executions
    assert kept[EXECUTION_HOP + "first"] == pytest.approx(0.0002)  # the median of its two runs' values
    assert kept["hop_item_s"] == 0.0002  # the workflow's hop stays
    entry = json.loads(next(tmp_path.glob("workflow-*.json")).read_text())
    assert EXECUTION_HOP + "plan 0" not in entry["seen"]  # its runs' values go with it


def test_a_whole_message_hop_that_earlier_versions_cached_is_not_read_as_a_per_item_one(tmp_path, monkeypatch):
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(tmp_path))
    graph = build_graph(spec_from_dict(workflow()))
    save_calibration(graph, {"hop_s": 0.004, "controller_s": 0.01})  # what a run before the per-item hop cached
    profile = profile_of(graph, Cluster.from_spec(graph.spec.cluster))
    assert (profile.hop_s, profile.hop_item_s) == (CHANNEL_HOP_S, HOP_ITEM_S)
    assert profile.controller_s == pytest.approx(0.01)


def test_profiling_runs_a_process_per_replica_so_the_hop_it_measures_is_real(tmp_path):
    from m2flow.runtime.profiling import _profiling_spec

    graph = build_graph(spec_from_dict(workflow(env_s=1e-4, policy_s=1e-4, cpus=1, mode="shared")))
    assert make_plan(graph, Cluster.from_spec(graph.spec.cluster)).processes  # the workflow itself would co-host
    spec = _profiling_spec(graph, 2, str(tmp_path))
    profiled = build_graph(spec)
    assert spec.placement.colocate is False
    assert make_plan(profiled, Cluster.from_spec(spec.cluster)).processes == []


def test_a_camera_simulator_s_costs_cached_where_the_cores_render_are_not_read_where_a_gpu_renders(
    config_path, tmp_path, monkeypatch
):
    from m2flow.config import load_spec

    monkeypatch.setenv("M2FLOW_COST_CACHE", str(tmp_path))
    from m2flow.planners import RENDERED_ON_GPU, device_kinds

    camera = config_path.parent / "ppo_camera.yaml"
    planned = {}
    for gpus in (0, 1):
        graph = build_graph(load_spec(camera, [f"cluster.gpus={gpus}", "cluster.cpus=4"]))
        planned[gpus] = graph, Cluster.from_spec(graph.spec.cluster)
    on_cores, on_gpu = (device_kinds(*planned[gpus]) for gpus in (0, 1))
    assert on_cores["env"] == "cpu" and on_gpu["env"] == RENDERED_ON_GPU and on_gpu["rollout"] == "gpu"
    save_cached(planned[0][0], on_cores, {"env.step": PortFit(fixed_s=0.002, per_item_s=0.001)})
    assert profile_of(*planned[0]).source["env.step"] == "cached"
    assert profile_of(*planned[1]).source["env.step"] == "default"  # drawn through EGL on the GPU: not measured


def test_a_kept_plan_merges_slices_as_the_measured_costs_say_and_its_notes_say_so(tmp_path, monkeypatch):
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(tmp_path))
    graph = build_graph(spec_from_dict(unmeasured("auto")))
    cluster = Cluster.from_spec(graph.spec.cluster)
    sliced = make_plan(build_graph(spec_from_dict(unmeasured(2))), cluster)
    assert sliced.merge_slices == ["policy.act"]  # the inference default is mostly per call
    assert any("policy.act takes into one call" in note for note in sliced.notes)

    def act_s(envs: int) -> float:
        return 0.001 * envs  # measured at 4 and 8 envs a call: all per row

    events = loop_calls([0, 1, 2], 2, per_item, act_s=act_s) + loop_calls([3, 4], 1, per_item, 100, act_s)
    kept = replan(graph, cluster, Running(sliced, 3, warmups=(0, 3)), events)
    assert not kept.switched and kept.plan.pipeline_stages == 2
    assert kept.plan.merge_slices == []
    merging = [note for note in kept.plan.notes if note.startswith("slices:")]
    assert len(merging) == 1 and "policy.act calls each slice apart" in merging[0] and "(mostly per row)" in merging[0]


def test_the_run_end_table_shows_each_cached_cost_with_the_sizes_runs_and_scatter_behind_it(tmp_path, monkeypatch):
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(tmp_path))
    graph = build_graph(spec_from_dict(workflow()))
    measured = ((4, 0.003), (2, 0.002), (4, 0.0032))  # 1 ms a call and 0.5 ms an env, give or take
    for items, seconds in measured:
        save_step_cost(graph, seconds, items)
    cached = cached_step_fit(graph)
    fit = cached.fit
    cost = load_cached(graph, {"env": "cpu"})["env.step"].cost
    assert fit.residual == pytest.approx(residual(list(measured), cost)) and fit.residual > 0
    console = Console(record=True, width=200)
    console.print(cached_costs_table({"env.step": cached}))
    line = next(line for line in console.export_text().splitlines() if "env.step" in line)
    row = [cell for cell in line.split() if cell != "│"]
    assert row[1:] == [
        f"{fit.fixed_s * 1e3:.3g}",
        "ms",
        f"{fit.per_item_s * 1e3:.3g}",
        "ms",
        "2,4",
        "3",
        f"{fit.residual:.0%}",
        "even",  # a loop port: its replicas step alike
    ]
    assert 0 < fit.fixed_s < 0.001  # under the 1 ms the means show: shrunk by its noise


def test_what_each_replica_of_a_sync_cost_is_cached_shown_and_predicts_the_next_runs_sync_phase(tmp_path, monkeypatch):
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(tmp_path))
    graph = build_graph(spec_from_dict(spin_workflow(4, 2, cpus=4, mode="hybrid", stages=2)))
    cluster = Cluster.from_spec(graph.spec.cluster)
    plan = make_plan(graph, cluster)
    devices = plan.placements["policy"].replica_devices

    def load_weights(replica: int, iteration: int, seconds: float) -> dict:
        args = {"worker": f"policy[{replica}]", "device": devices[replica].name, "items": 1, "iteration": iteration}
        return {"ph": "X", "name": "load_weights", "cat": "sync", "ts": 0, "dur": seconds * 1e6, "args": args}

    first_alone = [load_weights(r, it, 0.4 if r == 0 else 0.0) for it in range(1, 4) for r in (0, 1)]
    at_three = PortFit(0.2, 0.0, 3, (1,), (SizeMean(1, 0.2, 3),), replica_shares={3: (3.0, 0.0, 0.0)})
    save_cached(graph, {"policy": "cpu"}, {"policy.load_weights": at_three}, run="a run of three replicas")
    refitted = refit(graph, cluster, first_alone, Running(plan, since=0)).profile
    assert refitted.replica_shares["policy.load_weights"] == {2: pytest.approx((2.0, 0.0)), 3: (3.0, 0.0, 0.0)}
    remember(graph, cluster, first_alone, Running(plan, since=0), run="the first replica loads alone")
    profile = profile_of(graph, cluster)
    assert profile.source["policy.load_weights"] == "cached"
    assert profile.replica_shares["policy.load_weights"] == {2: pytest.approx((2.0, 0.0)), 3: (3.0, 0.0, 0.0)}
    predicted = simulate_plan(graph, plan, profile).prediction
    assert predicted.port_s["policy.load_weights"] == pytest.approx(0.4)  # the port's work: replica 0's alone
    assert 0.4 <= predicted.phase_s["sync"] < 0.41  # the phase waits for replica 0's load, not the mean's 0.2
    console = Console(record=True, width=200)
    console.print(
        cached_costs_table({"policy.load_weights": cached_fits(graph, {"policy": "cpu"})["policy.load_weights"]})
    )
    assert "2: 2.00/0.00" in next(line for line in console.export_text().splitlines() if "policy.load_weights" in line)


def test_a_port_called_only_in_the_warm_up_iteration_is_priced_from_those_calls_for_the_replan_but_not_cached(
    tmp_path, monkeypatch
):
    """`make run`'s evaluation runs in iteration 0, then one in 49: its first re-plan, after iterations 1-2, had no
    other call of it and predicted the sync phase without it. A port called every iteration is still fitted from the
    iterations after the warm-up alone."""
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(tmp_path))
    graph = build_graph(spec_from_dict(spin_workflow(4, 2, cpus=4, mode="hybrid", stages=2)))
    cluster = Cluster.from_spec(graph.spec.cluster)
    plan = make_plan(graph, cluster)
    assert profile_of(graph, cluster).source["policy.load_weights"] != MEASURED

    def call(worker: str, port: str, replica: int, iteration: int, seconds: float) -> dict:
        device = plan.placements[worker].replica_devices[replica].name
        args = {"worker": f"{worker}[{replica}]", "device": device, "items": 1, "iteration": iteration}
        return {"ph": "X", "name": port, "cat": "sync", "ts": iteration, "dur": seconds * 1e6, "args": args}

    events = [call("policy", "load_weights", r, 0, 0.4) for r in (0, 1)]  # in the warm-up iteration alone
    events += [call("trainer", "train", r, it, 0.9 if it == 0 else 0.1) for it in range(3) for r in (0, 1)]
    profile = refit(graph, cluster, events, Running(plan, since=0)).profile
    assert profile.source["policy.load_weights"] == MEASURED
    assert profile.call_s("policy", "load_weights", 1) == pytest.approx(0.4)
    assert profile.source["trainer.train"] == MEASURED
    assert profile.call_s("trainer", "train", 1) == pytest.approx(0.1)  # its warm-up calls left out
    # for this run's re-plan only: what the next runs start from is no warm-up's
    remember(graph, cluster, events, Running(plan, since=0), run="a run of three iterations")
    cached = cached_fits(graph, device_kinds(graph, cluster))
    assert "trainer.train" in cached and "policy.load_weights" not in cached
