"""The phases outside the loop, simulated once per placement and process layout and shared by its stage counts
(`Shared` in planners/simulation_cache.py)."""

from __future__ import annotations

import math

import pytest

import m2flow.planners.simulate as simulate_module
import m2flow.planners.simulation_cache as simulation_cache
from m2flow.cluster import Cluster
from m2flow.config import load_spec, spec_from_dict
from m2flow.graph import build_graph
from m2flow.planners import make_plan, profile_of
from m2flow.planners.processes import process_options
from m2flow.planners.profile import HANDOFF_COST, replica_share
from m2flow.planners.simulate import simulation
from m2flow.planners.simulation_cache import Shared
from m2flow.spec import PortCost
from tests.unit.test_symmetry import spin_workflow

NOTHING_BESIDE = frozenset()  # CPU-only plans: no port runs beside rendering (planners/render.py)


def swapping() -> dict:
    raw = spin_workflow(4, 2, cpus=4, mode="shared", stages=1)
    raw["placement"]["offload"] = "always"  # the trainer and the loop workers swap on the devices they share
    return raw


def every_third_sync() -> dict:
    raw = spin_workflow(4, 2, cpus=4, mode="hybrid", stages=2)
    raw["flow"]["sync"][0]["every"] = 3
    return raw


def co_hosted_work_after_the_loop() -> dict:
    """Simulator and policy on one core call after the loop too: in turn when co-hosted, sharing it when apart."""
    raw = spin_workflow(1, 1, 2, "shared", 1, trainers=1, devices={"env": "0", "policy": "0", "trainer": "1"})
    raw["flow"]["then"] = ["env.obs -> policy.act", "env.trajectory -> trainer.train"]
    for worker, port in (("env", "obs"), ("env", "trajectory"), ("policy", "act")):
        raw["workers"][worker]["profile"][port] = {"fixed_s": 0.01, "per_item_s": 0.0}
    return raw


CASES = {
    "hybrid, 8 envs over 4 policies": lambda: spin_workflow(8, 4, cpus=16, mode="hybrid"),
    "shared, swaps around every phase": swapping,
    "a sync every third iteration": every_third_sync,
    "asynchronous: training beside the loop": lambda: spin_workflow(4, 2, cpus=4, mode="hybrid", asynchronous=True),
    "co-hosted replicas' work after the loop": co_hosted_work_after_the_loop,
    "the camera job on one GPU": lambda: load_spec(
        "configs/ppo_camera.yaml", ["cluster.gpus=1", "cluster.cpus=16", "workers.env.args.video.save=false"]
    ).to_dict(),
}


def each_simulation(raw: dict):
    """The plan of `raw`, and for its placements every (stage count, process layout) a planner weighs."""
    spec = spec_from_dict(raw)
    graph, cluster = build_graph(spec), Cluster.from_spec(spec.cluster)
    plan = make_plan(graph, cluster)
    profile = profile_of(graph, cluster)
    options = [(s, p) for s in (1, 2, 4) for p in process_options(graph, plan.placements)]
    return graph, plan, profile, options


@pytest.mark.parametrize("case", CASES)
def test_simulations_that_share_the_phases_outside_the_loop_predict_and_schedule_as_each_alone(case):
    graph, plan, profile, options = each_simulation(CASES[case]())
    reused = Shared()
    for stages, processes in options:
        alone = simulation(
            graph, plan.placements, stages, profile, plan.phases, processes, beside_rendering=NOTHING_BESIDE
        )
        shared = simulation(
            graph, plan.placements, stages, profile, plan.phases, processes, reused, beside_rendering=NOTHING_BESIDE
        )
        a, b = alone.prediction, shared.prediction
        assert math.isclose(a.iteration_s, b.iteration_s, rel_tol=1e-12)
        assert a.phase_s.keys() == b.phase_s.keys()
        assert all(math.isclose(a.phase_s[k], b.phase_s[k], rel_tol=1e-12, abs_tol=1e-15) for k in a.phase_s)
        assert a.device_busy.keys() == b.device_busy.keys()
        assert all(math.isclose(a.device_busy[d], b.device_busy[d], rel_tol=1e-9) for d in a.device_busy)
        assert a.port_s.keys() == b.port_s.keys()
        assert all(math.isclose(a.port_s[k], b.port_s[k], rel_tol=1e-9) for k in a.port_s)
        assert (a.loop_step_s, a.hidden_s, a.trains_one_in) == (b.loop_step_s, b.hidden_s, b.trains_one_in)
        assert shared.tasks() == alone.tasks()
    shareable = [i for i, p in enumerate(plan.phases) if p.op != "loop" and not p.overlaps]
    assert sorted({index for _, index in reused.outside}) == shareable and shareable


def test_only_the_first_simulation_of_a_placement_and_process_layout_runs_its_phases_outside_the_loop(
    monkeypatch,
):
    graph, plan, profile, options = each_simulation(swapping())
    ran: list[str] = []
    layouts: list[list] = []
    run_phase, loop_classes = simulate_module.run_phase, simulation_cache.loop_classes
    monkeypatch.setattr(simulate_module, "run_phase", lambda phase, run: (ran.append(phase.op), run_phase(phase, run)))
    monkeypatch.setattr(
        simulation_cache,
        "loop_classes",
        lambda graph, devices, together, beside: (
            layouts.append(together),
            loop_classes(graph, devices, together, beside),
        )[1],
    )
    reused = Shared()
    for stages, processes in options:
        simulation(
            graph, plan.placements, stages, profile, plan.phases, processes, reused, beside_rendering=NOTHING_BESIDE
        )
    assert any(p.offload or p.onload for p in plan.phases) and len(options) > 1
    seen: set = set()
    expected = []
    for _, processes in options:  # every phase for a layout's first simulation; its loop alone for the others
        layout = tuple(map(tuple, processes))
        expected += ["loop"] if layout in seen else [p.op for p in plan.phases]
        seen.add(layout)
    assert ran == expected and len(expected) < len(options) * len(plan.phases)
    assert len(layouts) == len(seen) < len(options)


def test_what_a_placements_simulations_share_is_refused_to_another_placement():
    graph, plan, profile, options = each_simulation(swapping())
    reused = Shared()
    stages, processes = options[0]
    simulation(graph, plan.placements, stages, profile, plan.phases, processes, reused, beside_rendering=NOTHING_BESIDE)
    with pytest.raises(ValueError, match="these inputs are another's"):
        simulation(
            graph,
            dict(plan.placements),
            stages,
            profile,
            plan.phases,
            processes,
            reused,
            beside_rendering=NOTHING_BESIDE,
        )


def test_a_replayed_plans_tasks_use_the_costs_it_was_predicted_on():
    graph, plan, profile, options = each_simulation(swapping())
    reused = Shared()
    (first_stages, first_processes), (stages, processes) = options[0], options[1]
    simulation(
        graph,
        plan.placements,
        first_stages,
        profile,
        plan.phases,
        first_processes,
        reused,
        beside_rendering=NOTHING_BESIDE,
    )
    replayed = simulation(
        graph, plan.placements, stages, profile, plan.phases, processes, reused, beside_rendering=NOTHING_BESIDE
    )
    expected = simulation(
        graph, plan.placements, stages, profile.copy(), plan.phases, processes, beside_rendering=NOTHING_BESIDE
    ).tasks()
    for key in list(profile.costs):  # a refit changes the costs in place, after the prediction
        profile.costs[key] = PortCost(fixed_s=1.0, per_item_s=0.0)
    assert replayed.tasks() == expected


def test_a_sync_every_third_iteration_predicts_a_third_of_its_time_port_seconds_and_busy_time_per_iteration():
    def plan_with_sync_every(every: int):
        raw = spin_workflow(4, 2, cpus=4, mode="hybrid", stages=2)
        raw["flow"]["sync"][0]["every"] = every
        raw["workers"]["policy"]["profile"]["load_weights"] = {"fixed_s": 0.3, "per_item_s": 0.0}  # a heavy sync
        spec = spec_from_dict(raw)
        return make_plan(build_graph(spec), Cluster.from_spec(spec.cluster))

    each, third = plan_with_sync_every(1), plan_with_sync_every(3)
    assert each.layout_key == third.layout_key
    assert third.predicted.phase_s["sync"] == pytest.approx(each.predicted.phase_s["sync"] / 3)
    # per iteration, as a run measures them: a port's seconds and a device's busy time over all its iterations
    assert each.predicted.port_s["policy.load_weights"] == pytest.approx(2 * 0.3)  # both replicas, every iteration
    assert third.predicted.port_s["policy.load_weights"] == pytest.approx(2 * 0.3 / 3)
    loading, sending = each.placements["policy"].replica_devices, each.placements["trainer"].replica_devices
    for device in set(loading):
        busy_each = each.predicted.device_busy[device] * each.predicted.iteration_s
        busy_third = third.predicted.device_busy[device] * third.predicted.iteration_s
        assert busy_each < each.predicted.iteration_s  # not capped at the whole iteration
        sync_work = 0.3 * loading.count(device) + HANDOFF_COST.fixed_s * sending.count(device)  # the weights' source
        assert busy_each - busy_third == pytest.approx(sync_work * (1 - 1 / 3))


@pytest.mark.parametrize(("measured", "first_replica_s"), [({2: (2.0, 0.0)}, 0.6), ({3: (3.0, 0.0, 0.0)}, 0.9)])
def test_a_sync_measured_on_one_replica_alone_is_predicted_at_its_cost_there_at_the_count_measured_or_another(
    measured, first_replica_s
):
    raw = spin_workflow(4, 2, cpus=4, mode="hybrid", stages=2)  # two policy replicas load the weights
    raw["workers"]["policy"]["profile"]["load_weights"] = {"fixed_s": 0.3, "per_item_s": 0.0}  # the replicas' mean
    spec = spec_from_dict(raw)
    graph, cluster = build_graph(spec), Cluster.from_spec(spec.cluster)
    even = make_plan(graph, cluster)
    profile = profile_of(graph, cluster)
    profile.replica_shares["policy.load_weights"] = measured  # replica 0 does it all: at 3 replicas, 3 x 0.3 s
    plan = make_plan(graph, cluster, profile)
    assert plan.layout_key == even.layout_key
    # the phase waits for the first replica's load, as long as at the count measured, where the mean was measured
    assert plan.predicted.phase_s["sync"] == pytest.approx(even.predicted.phase_s["sync"] - 0.3 + first_replica_s)
    assert plan.predicted.port_s["policy.load_weights"] == pytest.approx(first_replica_s)  # the others load nothing


def test_a_replicas_share_at_a_count_no_run_measured_keeps_the_first_replicas_work_its_own():
    measured = {2: (1.5, 0.5), 4: (2.5, 0.5, 0.5, 0.5)}  # replica 0: rank-zero work on top of an even part
    assert [replica_share(measured, r, 2) for r in range(2)] == [1.5, 0.5]  # as measured at that count
    assert [replica_share(measured, r, 3) for r in range(3)] == [1.5, 0.5, 0.5]  # the nearest counts: the smaller, 2
    assert [replica_share(measured, r, 6) for r in range(6)] == [2.5] + [0.5] * 5  # the nearest count's, 4
    assert replica_share(measured, 0, 1) == 1.5
    assert [replica_share({}, r, 3) for r in range(3)] == [1.0, 1.0, 1.0]  # nothing measured: even
