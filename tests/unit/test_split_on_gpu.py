"""A cost a run measured at one batch size, split as the hardware has it: work on a GPU (a policy placed there, a
simulator rendering its cameras there) is flat at small batches, work on a core grows with its envs."""

from __future__ import annotations

import pytest

from m2flow.cluster import Cluster
from m2flow.config import spec_from_dict
from m2flow.graph import build_graph
from m2flow.planners import make_plan, profile_of
from m2flow.planners.fit import PortFit, save_profile
from m2flow.planners.profile import DEFAULT_COST, ON_GPU_COST, Profile, ports_on_gpu
from m2flow.runtime.replan import Running, refit
from m2flow.spec import PortCost
from tests.unit.test_trials import loop_calls, unmeasured


def two_slices(gpus: int, env_class: str):
    """The loop of 8 envs in two slices of 4, nothing declared of its costs, on 2 cores and `gpus` GPUs."""
    raw = unmeasured(2)
    raw["workers"]["env"]["class"] = env_class
    raw["cluster"]["gpus"] = gpus
    graph = build_graph(spec_from_dict(raw))
    cluster = Cluster.from_spec(graph.spec.cluster)
    return graph, make_plan(graph, cluster)


def same_at_any_size(envs: int) -> float:
    return 0.01  # a GPU renders 4 envs' cameras in the time it renders 8


def fraction_at(cost: PortCost, items: int) -> float:
    return cost.fixed_s / (cost.fixed_s + cost.per_item_s * items)


def prior_s(cost: PortCost, items: int) -> float:
    return cost.fixed_s + cost.per_item_s * items


def test_the_ports_on_a_gpu_are_a_gpu_workers_and_the_rendering_ports_of_a_simulator_on_a_node_with_one():
    graph, plan = two_slices(1, "tests.workers_for_tests.RenderingCounter")
    assert plan.placements["policy"].replica_devices[0].kind == "gpu"
    assert plan.placements["env"].replica_devices[0].kind == "cpu"
    on_gpus = {f"{worker}.{port}" for worker in ("policy", "learner") for port in graph.info[worker].ports}
    assert ports_on_gpu(graph, plan) == on_gpus | {"env.obs", "env.step"}
    graph, plan = two_slices(1, "tests.workers_for_tests.Counter")  # renders nothing
    assert ports_on_gpu(graph, plan) == on_gpus
    graph, plan = two_slices(0, "tests.workers_for_tests.RenderingCounter")  # no GPU to render on
    assert ports_on_gpu(graph, plan) == set()


# (GPUs, the simulator class, the priors of env.step and policy.act): its cameras rendered on a GPU, none to render,
# no GPU
PRIORS_BY_DEVICE = [
    (1, "tests.workers_for_tests.RenderingCounter", ON_GPU_COST["simulator"], ON_GPU_COST["inference"]),
    (1, "tests.workers_for_tests.Counter", DEFAULT_COST["simulator"], ON_GPU_COST["inference"]),
    (0, "tests.workers_for_tests.RenderingCounter", DEFAULT_COST["simulator"], DEFAULT_COST["inference"]),
]


@pytest.mark.parametrize(
    ("gpus", "env_class", "step_cost", "act_cost"),
    PRIORS_BY_DEVICE,
)
def test_a_port_nothing_measured_is_first_planned_at_the_default_of_the_device_its_work_will_run_on(
    tmp_path, monkeypatch, gpus, env_class, step_cost, act_cost
):
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(tmp_path))  # no earlier run measured it
    graph, plan = two_slices(gpus, env_class)
    profile = profile_of(graph, Cluster.from_spec(graph.spec.cluster))
    assert profile.source["env.step"] == profile.source["policy.act"] == "default"
    assert (profile.costs["env.step"], profile.costs["policy.act"]) == (step_cost, act_cost)


@pytest.mark.parametrize(
    ("gpus", "env_class", "step_prior", "act_prior"),
    PRIORS_BY_DEVICE,
)
def test_a_cost_measured_at_one_batch_size_splits_by_the_prior_of_the_device_its_work_ran_on(
    tmp_path, monkeypatch, gpus, env_class, step_prior, act_prior
):
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(tmp_path))  # no earlier run measured another size
    graph, plan = two_slices(gpus, env_class)
    events = loop_calls([0, 1, 2], 2, same_at_any_size)  # 4 envs a call
    costs = refit(graph, plan.cluster, events, Running(plan, 0, warmups=(0,))).profile.costs
    assert fraction_at(costs["env.step"], 4) == pytest.approx(fraction_at(step_prior, 4))
    assert fraction_at(costs["policy.act"], 4) == pytest.approx(fraction_at(act_prior, 4))
    assert costs["env.step"].fixed_s + 4 * costs["env.step"].per_item_s == pytest.approx(0.01)  # the mean measured


def test_a_step_rendered_on_a_gpu_is_predicted_near_its_cost_at_twice_the_envs_where_a_cores_split_doubles_it(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(tmp_path))
    predicted = {}
    for gpus in (1, 0):
        graph, plan = two_slices(gpus, "tests.workers_for_tests.RenderingCounter")
        events = loop_calls([0, 1, 2], 2, same_at_any_size)
        step = refit(graph, plan.cluster, events, Running(plan, 0, warmups=(0,))).profile.costs["env.step"]
        predicted[gpus] = step.fixed_s + 8 * step.per_item_s  # what one stage's slice of 8 envs would cost
    for gpus, prior in ((1, ON_GPU_COST["simulator"]), (0, DEFAULT_COST["simulator"])):
        assert predicted[gpus] == pytest.approx(0.01 * prior_s(prior, 8) / prior_s(prior, 4))
    assert predicted[1] < 1.2 * 0.01  # it costs 0.01 s at 8 envs as at 4
    assert predicted[0] > 1.8 * 0.01  # a core's prior reads nearly all of it per env


def test_a_simulator_placed_on_a_gpu_does_all_its_work_there():
    raw = unmeasured(2)
    raw["workers"]["env"]["resources"] = {"device": "gpu"}
    raw["cluster"]["gpus"] = 2
    graph = build_graph(spec_from_dict(raw))
    plan = make_plan(graph, Cluster.from_spec(graph.spec.cluster))
    assert plan.placements["env"].replica_devices[0].kind == "gpu"
    assert {f"env.{port}" for port in graph.info["env"].ports} <= ports_on_gpu(graph, plan)  # Counter renders nothing


def test_a_split_m2flow_profile_measured_at_one_size_gives_way_to_the_prior_and_one_of_two_sizes_is_kept():
    graph, _ = two_slices(1, "tests.workers_for_tests.RenderingCounter")
    one_size = PortFit(fixed_s=0.0, per_item_s=0.0025, calls=3, batch_sizes=(4,))  # all per env: no split seen
    two_sizes = PortFit(fixed_s=0.009, per_item_s=0.00025, calls=6, batch_sizes=(4, 8))
    for fit, fraction in (
        (one_size, fraction_at(ON_GPU_COST["simulator"], 4)),
        (two_sizes, fraction_at(two_sizes.cost, 4)),
    ):
        profile = Profile.from_graph(graph, measured={"ports": {"env.step": fit}})
        assert profile.source["env.step"] == "measured"
        assert profile.per_call_fraction("env.step", 4, on_gpu=True) == pytest.approx(fraction)


@pytest.mark.parametrize(("sizes", "unsplit"), [((4,), ["env.step"]), ((4, 8), [])])
def test_a_loop_port_m2flow_profile_measured_at_one_size_is_still_unsplit_and_one_it_measured_at_two_is_not(
    tmp_path, monkeypatch, sizes, unsplit
):
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(tmp_path / "cache"))
    fit = PortFit(fixed_s=0.009, per_item_s=0.00025, calls=6, batch_sizes=sizes)
    raw = unmeasured(2)
    raw["placement"]["profile"] = str(save_profile({"source": "test", "ports": {"env.step": fit}}, tmp_path / "p.json"))
    graph = build_graph(spec_from_dict(raw))
    cluster = Cluster.from_spec(graph.spec.cluster)
    measured = refit(graph, cluster, loop_calls([0, 1, 2], 2, same_at_any_size), Running(make_plan(graph, cluster), 0))
    assert [port for port in measured.unsplit if port == "env.step"] == unsplit
    assert not measured.profile.split_measured  # this run's line stands now, not the one `m2flow profile` measured
