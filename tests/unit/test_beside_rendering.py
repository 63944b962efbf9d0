"""Ports beside rendering (`planners/render.py`): where camera simulators render on the GPU a policy acts on, a
plan of two stages or more runs the act beside the other stage's rendering. What a run measures of such ports there
is fitted and cached apart, stands for their cost elsewhere until measured so, and a run that measured them only
beside rendering tries a plan of one stage where it could pay."""

from __future__ import annotations

import pytest

from m2flow.cluster import Cluster
from m2flow.config import load_spec
from m2flow.graph import build_graph
from m2flow.planners import make_plan, profile_of
from m2flow.planners.cache import save_cached
from m2flow.planners.fit import PortFit, SizeMean, beside, points_from_trace
from m2flow.planners.render import beside_rendering
from m2flow.planners.simulate import simulate_plan
from m2flow.runtime.replan import Running, replan
from m2flow.schedule import unknown_costs
from tests.conftest import ROOT

LOOP = frozenset({"rollout.act", "env.step"})


def camera(gpus: int = 1, cpus: int = 4, stages: int | str = "auto", mode: str = "hybrid", config="ppo_camera.yaml"):
    """The camera job, small: two simulators of 8 envs on the cores, the policy on the GPU where there is one."""
    overrides = [f"cluster.gpus={gpus}", f"cluster.cpus={cpus}", "cluster.gpu_memory_gb=80", f"placement.mode={mode}"]
    overrides += [f"placement.pipeline_stages={stages}", "flow.loop.horizon=8", "run.iterations=20"]
    if config == "ppo_camera.yaml":
        overrides += ["workers.env.replicas=2", "workers.env.args.num_envs=8"]
    graph = build_graph(load_spec(ROOT / "configs" / config, overrides))
    return graph, Cluster.from_spec(graph.spec.cluster)


def ports_beside(graph, plan) -> frozenset[str]:
    return beside_rendering(graph, plan.placements, plan.pipeline_stages, plan.cluster)


@pytest.mark.parametrize("mode", ["shared", "hybrid"])
def test_act_and_the_camera_step_run_beside_rendering_only_in_plans_of_two_stages_or_more_on_a_shared_gpu(mode):
    for stages, expected in ((1, frozenset()), (2, LOOP), (4, LOOP)):
        graph, cluster = camera(stages=stages, mode=mode)
        plan = make_plan(graph, cluster)
        assert plan.pipeline_stages == stages and ports_beside(graph, plan) == expected
    graph, cluster = camera(gpus=2, stages=2, mode="disaggregated")  # rendering on the GPU the policy does not use
    plan = make_plan(graph, cluster)
    assert {d.name for d in plan.placements["rollout"].replica_devices} == {"n0/gpu0"}
    assert not ports_beside(graph, plan)
    graph, cluster = camera(gpus=0, stages=2)  # no GPU: the cores draw
    assert not ports_beside(graph, make_plan(graph, cluster))
    graph, cluster = camera(stages=2, config="ppo_mujoco.yaml")  # no cameras: nothing renders
    assert not ports_beside(graph, make_plan(graph, cluster))


def loop_calls(iterations, stages: int, step_s: float, act_s: float, beside_rendering: bool) -> list[dict]:
    """A traced loop of the small camera job: per iteration 8 steps of `stages` slices, each slice a step of
    each simulator and an act, marked as run beside rendering or not (as the controller traces them)."""
    events, at, envs = [], 0.0, 8 // stages
    for iteration in iterations:
        for _ in range(8 * stages):
            for port, worker, device, seconds, items in (
                ("step", "env[0]", "n0/cpu0", step_s, envs),
                ("step", "env[1]", "n0/cpu1", step_s, envs),
                ("act", "rollout[0]", "n0/gpu0", act_s, 2 * envs),
            ):
                args = {"worker": worker, "iteration": iteration, "items": items, "device": device}
                if beside_rendering:
                    args["beside_rendering"] = True
                events.append(
                    {"ph": "X", "name": port, "cat": "loop", "ts": at * 1e6, "dur": seconds * 1e6, "args": args}
                )
                at += seconds
    return events


def test_a_call_traced_beside_rendering_is_fitted_as_the_port_beside_rendering():
    events = loop_calls([1], 2, 0.004, 0.003, True) + loop_calls([2], 1, 0.003, 0.001, False)
    points = points_from_trace({"traceEvents": events}, skip_iterations=1)
    assert set(points) == {"env.step", "rollout.act", beside("env.step"), beside("rollout.act")}
    assert {seconds for _, seconds in points[beside("rollout.act")]} == {0.003}
    assert {seconds for _, seconds in points["rollout.act"]} == {0.001}


def fit(seconds: float, items: int) -> PortFit:
    return PortFit(
        fixed_s=seconds, per_item_s=0.0, calls=10, batch_sizes=(items,), by_size=(SizeMean(items, seconds, 10),)
    )


def test_a_cost_measured_only_beside_rendering_stands_for_the_port_until_a_run_measures_it_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(tmp_path))
    graph, cluster = camera()
    kinds = {"rollout": "gpu"}
    save_cached(graph, kinds, {beside("rollout.act"): fit(0.003, 8)})
    profile = profile_of(graph, cluster)
    assert profile.source[beside("rollout.act")] == "cached"
    assert profile.source["rollout.act"] == "cached beside rendering"  # known: no calibration for want of it
    assert "rollout.act" not in unknown_costs(profile.source)
    one, two = (make_plan(camera(stages=s)[0], cluster) for s in (1, 2))
    act = {s: simulate_plan(graph, plan, profile).prediction.port_s["rollout.act"] for s, plan in ((1, one), (2, two))}
    assert act[1] == pytest.approx(8 * 0.003) and act[2] == pytest.approx(16 * 0.003)  # per call as measured
    assert one.predicted.cost_sources["rollout.act"] == two.predicted.cost_sources["rollout.act"]
    save_cached(graph, kinds, {"rollout.act": fit(0.001, 16)})  # a run of one stage measured it alone
    profile = profile_of(graph, cluster)
    assert profile.source["rollout.act"] == "cached"
    act = {s: simulate_plan(graph, plan, profile).prediction.port_s["rollout.act"] for s, plan in ((1, one), (2, two))}
    assert act[1] == pytest.approx(8 * 0.001) and act[2] == pytest.approx(16 * 0.003)
    assert profile.sources_in(ports_beside(graph, two))["rollout.act"] == "cached beside rendering"


def test_a_run_that_measured_the_gpu_only_beside_rendering_tries_one_stage_and_keeps_what_ran_faster(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(tmp_path))
    graph, cluster = camera()
    pipelined = make_plan(camera(stages=2)[0], cluster)
    assert ports_beside(graph, pipelined) == LOOP
    first = loop_calls([0, 1, 2], 2, 0.004, 0.004, beside_rendering=True)  # 4 ms a step and an act, beside
    tried = replan(graph, cluster, Running(pipelined, 0, warmups=(0,)), first, may_try=True)
    assert tried.trial and tried.plan.pipeline_stages == 1, tried.why
    assert "measured only beside rendering on their GPU; were they 1.5x as fast" in tried.why
    assert not replan(graph, cluster, Running(pipelined, 0, warmups=(0,)), first).switched  # not without a trial
    # the trial: one stage, the act and the step alone; its first iteration warms up
    trial = Running(tried.plan, 3, warmups=(0, 3), tried_from=pipelined)
    alone = loop_calls([3, 4, 5], 1, 0.002, 0.002, beside_rendering=False)
    for event in alone:
        event["ts"] += 100e6
    kept = replan(graph, cluster, trial, first + alone)
    assert not kept.switched and kept.plan.pipeline_stages == 1, kept.why
    slow_alone = loop_calls([3, 4, 5], 1, 0.008, 0.006, beside_rendering=False)  # no faster alone: back
    for event in slow_alone:
        event["ts"] += 100e6
    back = replan(graph, cluster, trial, first + slow_alone)
    assert back.switched and back.plan.pipeline_stages == 2, back.why
