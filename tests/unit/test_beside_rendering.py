"""Ports beside rendering (`planners/render.py`): where camera simulators render on the GPU a policy acts on, a
plan of two stages or more runs the act beside the other stage's rendering. What a run measures of such ports there
is fitted and cached apart, stands for their cost elsewhere until measured so, and a run that measured them only
beside rendering tries a plan of one stage where it could pay."""

from __future__ import annotations

import pytest

import m2flow.planners.simulation_cache as simulation_cache
from m2flow.cluster import Cluster
from m2flow.config import load_spec
from m2flow.graph import build_graph
from m2flow.planners import make_plan, profile_of
from m2flow.planners.cache import save_cached
from m2flow.planners.fit import PortFit, SizeMean
from m2flow.planners.profile import Profile
from m2flow.planners.render import ReplicaPort, beside_rendering, ports_of, render_gpus
from m2flow.planners.simulate import simulate_plan
from m2flow.planners.symmetry import LoopClass, loop_classes
from m2flow.planners.trace_calls import points_from_trace, rendering_key
from m2flow.schedule import Placement, ReplicaId, unknown_costs
from tests.conftest import ROOT

LOOP = frozenset({"rollout.act", "env.step"})


def camera(
    gpus: int = 1,
    cpus: int = 4,
    stages: int | str = "auto",
    mode: str = "hybrid",
    config="ppo_camera.yaml",
    extra: tuple[str, ...] = (),
):
    """The camera job, small: two simulators of 8 envs on the cores, the policy on the GPU where there is one;
    `extra` overrides after these."""
    overrides = [f"cluster.gpus={gpus}", f"cluster.cpus={cpus}", "cluster.gpu_memory_gb=80", f"placement.mode={mode}"]
    overrides += [f"placement.pipeline_stages={stages}", "flow.loop.horizon=8", "run.iterations=20"]
    if config == "ppo_camera.yaml":
        overrides += ["workers.env.replicas=2", "workers.env.args.num_envs=8"]
    overrides += list(extra)
    graph = build_graph(load_spec(ROOT / "configs" / config, overrides))
    return graph, Cluster.from_spec(graph.spec.cluster)


def ports_beside(graph, plan) -> frozenset[str]:
    return ports_of(beside_rendering(graph, plan.placements, plan.pipeline_stages, plan.cluster))


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
    assert set(points) == {"env.step", "rollout.act", rendering_key("env.step"), rendering_key("rollout.act")}
    assert {seconds for _, seconds in points[rendering_key("rollout.act")]} == {0.003}
    assert {seconds for _, seconds in points["rollout.act"]} == {0.001}


def fit(seconds: float, items: int) -> PortFit:
    return PortFit(
        fixed_s=seconds, per_item_s=0.0, calls=10, batch_sizes=(items,), by_size=(SizeMean(items, seconds, 10),)
    )


def test_a_cost_measured_only_beside_rendering_stands_in_for_the_port_as_unknown_until_a_run_measures_it_alone(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(tmp_path))
    graph, cluster = camera()
    kinds = {"rollout": "gpu"}
    save_cached(graph, kinds, {rendering_key("rollout.act"): fit(0.003, 8)})
    profile = profile_of(graph, cluster)
    assert profile.source[rendering_key("rollout.act")] == "cached"
    assert profile.source["rollout.act"] == "cached beside rendering"
    one, two = (make_plan(camera(stages=s)[0], cluster) for s in (1, 2))
    act = {s: simulate_plan(graph, plan, profile).prediction.port_s["rollout.act"] for s, plan in ((1, one), (2, two))}
    assert act[1] == pytest.approx(8 * 0.003) and act[2] == pytest.approx(16 * 0.003)  # per call as measured
    # a plan of one stage does not know what it costs there: a run of it measures it (`m2flow run` calibrates)
    assert "rollout.act" in one.predicted.unknown_costs and "rollout.act" not in two.predicted.unknown_costs
    assert two.predicted.cost_sources["rollout.act"] == "cached"
    save_cached(graph, kinds, {"rollout.act": fit(0.001, 16)})  # a run of one stage measured it alone
    profile = profile_of(graph, cluster)
    assert profile.source["rollout.act"] == "cached" and "rollout.act" not in unknown_costs(profile.source)
    act = {s: simulate_plan(graph, plan, profile).prediction.port_s["rollout.act"] for s, plan in ((1, one), (2, two))}
    assert act[1] == pytest.approx(8 * 0.001) and act[2] == pytest.approx(16 * 0.003)


def test_a_profile_file_s_cost_beside_rendering_is_read_as_the_cache_s_is(tmp_path, monkeypatch):
    """`m2flow profile --from-trace` of a pipelined GPU run writes the ports beside rendering under their own keys."""

    monkeypatch.setenv("M2FLOW_COST_CACHE", str(tmp_path))
    graph, _ = camera()
    measured = {"ports": {rendering_key("rollout.act"): fit(0.003, 8)}}
    profile = Profile.from_graph(graph, measured, {}, frozenset({"rollout.act"}))
    assert profile.source[rendering_key("rollout.act")] == "measured"
    assert profile.source["rollout.act"] == "measured beside rendering"
    assert profile.call_s("rollout", "act", 8, beside_rendering=True) == pytest.approx(0.003)


def test_on_two_nodes_only_the_replicas_whose_gpu_the_policy_shares_run_beside_rendering():
    """Simulators on the second node render on its own GPU, which no policy replica uses: they and their calls
    run alone, those of the first node beside the policy's acting."""

    graph, _ = camera(gpus=2, cpus=4)
    cluster = Cluster.from_spec(graph.spec.cluster.model_copy(update={"nodes": 2}))
    gpu = {d.node: d for d in cluster.of_kind("gpu")}
    cores = [next(d for d in cluster.of_kind("cpu") if d.node == node) for node in (0, 1)]
    placements = {
        "env": Placement("env", cores, cores),
        "rollout": Placement("rollout", [gpu[0]], [gpu[0]]),
        "actor": Placement("actor", [gpu[0]], [gpu[0]]),
    }
    plan = make_plan(graph, cluster)  # any plan of this cluster, its placements replaced by the ones above
    plan.placements = placements
    assert {r.replica: g.name for r, g in render_gpus(graph, plan).items()} == {0: "n0/gpu0", 1: "n1/gpu1"}
    beside = beside_rendering(graph, placements, 2, cluster)
    assert beside == {ReplicaPort(ReplicaId("env", 0), "step"), ReplicaPort(ReplicaId("rollout", 0), "act")}
    assert not beside_rendering(graph, placements, 1, cluster)


def test_components_alike_but_for_their_ports_beside_rendering_are_each_priced_as_they_run(tmp_path, monkeypatch):
    """Two nodes, a simulator and a policy replica on each: the first node's simulator renders on a GPU no policy
    uses, the second's on the GPU its policy replica acts on. The two loop components line up one to one (the same
    workers, shards and device sharing), but only the second's act and step run beside rendering: the plan prices
    each as it runs, as simulating every replica does, not the second as a copy of the first."""
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(tmp_path))
    graph, _ = camera(gpus=3, cpus=4, stages=2, extra=("workers.rollout.replicas=2",))
    cluster = Cluster.from_spec(graph.spec.cluster.model_copy(update={"nodes": 2}))
    save_cached(graph, {"rollout": "gpu"}, {"rollout.act": fit(0.001, 8), rendering_key("rollout.act"): fit(0.02, 8)})
    gpu = {d.name: d for d in cluster.of_kind("gpu")}
    cores = [next(d for d in cluster.of_kind("cpu") if d.node == node) for node in (0, 1)]
    acting = [gpu["n0/gpu0"], gpu["n1/gpu2"]]
    plan = make_plan(graph, cluster)  # any plan of this cluster, its placements and stages replaced
    plan.placements = {
        "env": Placement("env", cores, cores),
        "rollout": Placement("rollout", acting, acting),
        "actor": Placement("actor", [gpu["n0/gpu1"]], [gpu["n0/gpu1"]]),
    }
    plan.pipeline_stages, plan.processes = 2, []
    beside = beside_rendering(graph, plan.placements, 2, plan.cluster)
    assert ReplicaPort(ReplicaId("rollout", 1), "act") in beside
    assert ReplicaPort(ReplicaId("rollout", 0), "act") not in beside
    devices = {w: p.replica_devices for w, p in plan.placements.items()}
    assert [len(k.components) for k in loop_classes(graph, devices, {}, frozenset())] == [2]  # alike but for that
    assert [len(k.components) for k in loop_classes(graph, devices, {}, beside)] == [1, 1]
    profile = profile_of(graph, cluster)
    assert profile.call_s("rollout", "act", 8, beside_rendering=True) > profile.call_s("rollout", "act", 8)
    copied = simulate_plan(graph, plan, profile).prediction
    with monkeypatch.context() as patch:
        patch.setattr(
            simulation_cache,
            "loop_classes",
            lambda *args: [LoopClass((c,)) for k in loop_classes(*args) for c in k.components],
        )
        every_replica = simulate_plan(graph, plan, profile).prediction
    assert copied.port_s["rollout.act"] == pytest.approx(every_replica.port_s["rollout.act"], rel=1e-12)
    assert copied.iteration_s == pytest.approx(every_replica.iteration_s, rel=1e-12)
