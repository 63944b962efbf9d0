"""The floor under a layout's iteration (`planners/floor.py`) and the allocation search that skips layouts by it."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest
from rich.console import Console

import m2flow.planners.allocation as allocation
from m2flow.cluster import Cluster
from m2flow.config import spec_from_dict
from m2flow.errors import PlanError
from m2flow.graph import build_graph
from m2flow.planners import get_planner, make_plan, profile_of
from m2flow.planners.floor import iteration_floor_s, loop_floor_s, then_floor_s
from m2flow.viz.tables import SKIPPED, candidates_table
from tests.unit.test_symmetry import spin_workflow

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from planner import big_workflow  # noqa: E402


def plan_and_floor(raw: dict):
    graph = build_graph(spec_from_dict(raw))
    cluster = Cluster.from_spec(graph.spec.cluster)
    return make_plan(graph, cluster), loop_floor_s(graph, profile_of(graph, cluster))


def assert_above_its_floors(raw: dict) -> None:
    graph = build_graph(spec_from_dict(raw))
    cluster = Cluster.from_spec(graph.spec.cluster)
    plan, profile = make_plan(graph, cluster), profile_of(graph, cluster)
    predicted = plan.predicted
    assert predicted.phase_s["loop"] >= loop_floor_s(graph, profile)
    if graph.spec.flow.asynchronous is None:
        assert predicted.phase_s["then"] >= then_floor_s(graph, profile) > 0
    assert predicted.iteration_s >= iteration_floor_s(graph, profile)


GRID = [
    # (simulator replicas, inference replicas, cpus, mode, stages, merged slices, horizon, the policy's per-call s)
    case
    for case in itertools.product(
        (1, 2, 4),
        (1, 2),
        (2, 4),
        ("shared", "hybrid", "disaggregated"),
        (1, 2, 4),
        (True, False),
        (10, 300),
        (2e-3, 0.0),
    )
    if case[1] <= case[0]
]


def test_no_plan_predicts_a_loop_after_loop_phase_or_iteration_under_its_floor():
    """Every placement, stage count and merging of a grid of spin workflows, loops short enough to simulate
    every step and long ones extrapolated from 16: the predicted loop, after-loop phase and iteration are at
    least their floors."""
    planned = 0
    for envs, policies, cpus, mode, stages, merge, horizon, fixed_s in GRID:
        raw = spin_workflow(envs, policies, cpus, mode, stages, trainers=1)
        raw["placement"]["merge_slices"] = merge
        raw["flow"]["loop"]["horizon"] = horizon
        raw["workers"]["policy"]["profile"]["act"]["fixed_s"] = fixed_s
        try:
            assert_above_its_floors(raw)
        except PlanError:  # disaggregated needs a device per worker, 4 slices 4 envs a replica
            continue
        planned += 1
    assert planned >= 200, planned


@pytest.mark.parametrize(
    "envs, policies, cpus, devices",
    [
        (1, 1, 1, None),  # simulator and policy on one core
        (2, 2, 2, {"env": "0", "policy": "1", "trainer": "1"}),  # two policies on one core, by hand
    ],
)
@pytest.mark.parametrize("colocate", ["auto", False])
def test_a_replica_running_ahead_of_another_on_its_device_does_not_shorten_the_predicted_step(
    envs, policies, cpus, devices, colocate
):
    """Four slices of a long loop where replicas share a core (review cases): the simulated steps' ends had a
    slope under that core's work per step, and the loop was predicted under its floor."""
    raw = spin_workflow(envs, policies, cpus, "shared", 4, trainers=1, colocate=colocate, devices=devices)
    raw["workers"]["env"]["args"]["num_envs"] = 12
    raw["workers"]["env"]["profile"]["step"] = {"fixed_s": 1e-4, "per_item_s": 0.0}
    raw["workers"]["policy"]["profile"]["act"] = {"fixed_s": 1e-4, "per_item_s": 1e-3}
    raw["flow"]["loop"]["horizon"] = 1000
    raw["placement"]["merge_slices"] = False
    graph = build_graph(spec_from_dict(raw))
    plan = make_plan(graph, Cluster.from_spec(graph.spec.cluster))
    busiest = max(
        sum(t.work_s for t in plan.tasks if t.phase == "loop" and t.step == 5 and t.device == device)
        for device in {t.device for t in plan.tasks}
    )
    assert plan.predicted.loop_step_s >= busiest * (1 - 1e-9)
    assert_above_its_floors(raw)


@pytest.mark.parametrize("gpus", [16, 32])
@pytest.mark.parametrize("trainers", [1, 2, 4])
def test_no_plan_of_five_workers_predicts_an_iteration_under_its_floor(gpus, trainers):
    """benchmarks/planner.py's workflow: trajectories sharded over the actor's ranks and broadcast to every
    reward model replica, whose rank zero alone feeds the critic."""
    raw = big_workflow(gpus, 5)
    raw["workers"]["actor"]["replicas"] = trainers
    assert_above_its_floors(raw)


def test_an_asynchronous_flows_floor_is_its_loops_alone():
    raw = spin_workflow(2, 1, 4, "hybrid", 2, asynchronous=True, trainers=1)
    graph = build_graph(spec_from_dict(raw))
    profile = profile_of(graph, Cluster.from_spec(graph.spec.cluster))
    assert iteration_floor_s(graph, profile) == loop_floor_s(graph, profile) > 0
    assert_above_its_floors(raw)


def test_the_floor_is_the_busiest_replicas_calls_on_all_its_rows_each_step():
    # 2 simulators x 4 envs (a step 1 ms + 4 x 0.5 ms), one policy serving both: its act on 8 rows
    # (4 ms + 8 x 0.1 ms) is the busiest replica's work a step, whatever the 4 slices make of it
    raw = spin_workflow(2, 1, 4, "hybrid", 4, trainers=1)
    raw["workers"]["policy"]["profile"]["act"]["fixed_s"] = 4e-3
    plan, floor_s = plan_and_floor(raw)
    assert floor_s == pytest.approx(40 * (4e-3 + 8 * 1e-4))
    assert plan.predicted.phase_s["loop"] > floor_s


def test_the_allocation_search_skips_layouts_by_their_floor_and_keeps_what_trying_every_one_keeps(monkeypatch):
    raw = big_workflow(64, 5, allocate=True)  # benchmarks/planner.py's: inference and training replicas chosen
    graph = build_graph(spec_from_dict(raw))
    cluster = Cluster.from_spec(graph.spec.cluster)
    skipping = make_plan(graph, cluster)
    monkeypatch.setattr(allocation, "iteration_floor_s", lambda graph, profile: 0.0)  # no layout is ever skipped
    every = make_plan(graph, cluster)
    assert skipping.spec_overrides == every.spec_overrides
    assert (skipping.mode, skipping.pipeline_stages) == (every.mode, every.pipeline_stages)
    assert skipping.predicted.iteration_s == every.predicted.iteration_s
    assert "skipped: their floor is above the best" in skipping.notes[0]
    assert "skipped" not in every.notes[0]
    feasible = [row for row in every.candidates if row.feasible]
    assert len([row for row in skipping.candidates if row.feasible]) < len(feasible)
    # every layout tried has its row: a skipped one shows the floor it was skipped by
    assert {row.layout for row in skipping.candidates} == {row.layout for row in every.candidates}
    skipped = [row for row in skipping.candidates if row.floor_s is not None]
    assert f"{len(skipped)} skipped" in skipping.notes[0]
    assert all(row.floor_s > skipping.predicted.iteration_s and not row.feasible for row in skipped)
    console = Console(width=200, record=True)
    console.print(candidates_table(skipping))
    text = console.export_text()
    assert text.count("skipped") == len(skipped) + 1 and SKIPPED.split(";")[0] in text  # the rows and the caption


def ascending_search(graph, cluster) -> tuple[list[str], float]:
    """The allocation search as it was before the floor: each worker's counts from the fewest up, a layout
    taking the place of the best only when faster; every layout simulated."""
    search = allocation.Allocation(
        graph, cluster, profile_of(graph, cluster), get_planner(graph.spec.placement.mode).plan
    )
    counts = {w: graph.workers[w].count for w in search.options}
    best = search.evaluate(counts)
    for _ in range(allocation.SWEEPS):
        improved = False
        for worker, choices in search.options.items():
            for n in choices:
                plan = search.evaluate({**counts, worker: n})
                if plan is not None and (best is None or plan.predicted.iteration_s < best.predicted.iteration_s):
                    best, counts, improved = plan, {**counts, worker: n}, True
        if not improved:
            break
    return best.spec_overrides, best.predicted.iteration_s


@pytest.mark.parametrize("heavy", [False, True])  # heavy: acting and training per row, so the floor skips layouts
@pytest.mark.parametrize("envs, cpus, trainers", [(2, 4, "auto"), (4, 4, 1), (4, 8, "auto"), (6, 8, "auto")])
def test_the_search_from_the_most_replicas_down_keeps_what_the_search_from_the_fewest_up_kept(
    envs, cpus, trainers, heavy
):
    raw = spin_workflow(envs, 1, cpus, "auto", 2, trainers=1)
    raw["workers"]["policy"]["replicas"] = "auto"
    raw["workers"]["trainer"]["replicas"] = trainers
    raw["placement"]["pipeline_stages"] = "auto"
    if heavy:
        raw["workers"]["policy"]["profile"]["act"] = {"fixed_s": 1e-4, "per_item_s": 1e-3}
        raw["workers"]["trainer"]["profile"]["train"] = {"fixed_s": 0.01, "per_item_s": 1e-4}
    graph = build_graph(spec_from_dict(raw))
    cluster = Cluster.from_spec(graph.spec.cluster)
    plan = make_plan(graph, cluster)
    assert (plan.spec_overrides, plan.predicted.iteration_s) == ascending_search(graph, cluster)


def test_on_a_tie_the_search_keeps_the_fewest_replicas_as_the_search_from_the_fewest_up_did():
    # benchmarks/planner.py's five workers on 64 GPUs: training at 8 ranks or more is predicted alike
    graph = build_graph(spec_from_dict(big_workflow(64, 5, allocate=True)))
    cluster = Cluster.from_spec(graph.spec.cluster)
    plan = make_plan(graph, cluster)
    tied = [row for row in plan.candidates if row.feasible and row.iteration_s == plan.predicted.iteration_s]
    assert len({row.layout for row in tied}) > 1
    assert (plan.spec_overrides, plan.predicted.iteration_s) == ascending_search(graph, cluster)


@pytest.mark.parametrize("envs", [2, 4, 8])
def test_a_search_starting_from_the_declared_simulator_processes_keeps_what_trying_them_first_kept(envs):
    raw = spin_workflow(envs, 1, 8, "auto", 2, trainers=1)  # 4 envs a process: `envs` processes declared
    raw["workers"]["policy"]["replicas"] = "auto"
    raw["placement"]["search_processes"] = True  # the simulator's processes from 1 to 8, the start among them
    raw["placement"]["pipeline_stages"] = "auto"
    graph = build_graph(spec_from_dict(raw))
    cluster = Cluster.from_spec(graph.spec.cluster)
    plan = make_plan(graph, cluster)
    assert (plan.spec_overrides, plan.predicted.iteration_s) == ascending_search(graph, cluster)
    assert f"env {envs} x 4, policy 1" in {row.layout for row in plan.candidates}  # the start has its row


def test_a_layout_whose_floor_is_over_the_best_only_by_rounding_is_still_tried_and_wins_its_tie(monkeypatch):
    # every cost but the simulator's step is zero: each layout's iteration is its floor, 7 steps of 0.1 s,
    # which the floor (7 x 0.1) and the simulator (0.1 + 0.1 + ...) round differently
    raw = spin_workflow(2, 1, 4, "disaggregated", 1, trainers=1)
    raw["workers"]["env"]["profile"] = {
        "step": {"fixed_s": 0.1},
        "obs": {"fixed_s": 0.0},
        "trajectory": {"fixed_s": 0.0},
    }
    raw["workers"]["policy"]["profile"] = {"act": {"fixed_s": 0.0}, "load_weights": {"fixed_s": 0.0}}
    raw["workers"]["policy"]["replicas"] = "auto"
    raw["workers"]["trainer"]["profile"] = {"train": {"fixed_s": 0.0}, "weights": {"fixed_s": 0.0}}
    raw["flow"]["loop"]["horizon"] = 7
    graph = build_graph(spec_from_dict(raw))
    cluster = Cluster.from_spec(graph.spec.cluster)
    profile = profile_of(graph, cluster)
    profile.hop_s = profile.controller_s = 0.0

    def search():
        found = allocation.Allocation(graph, cluster, profile, get_planner("auto").plan)
        return found.best(), found.skipped

    plan, skipped = search()
    assert (plan.spec_overrides, plan.predicted.iteration_s, skipped) == (["workers.policy.replicas=1"], 0.7, 0)
    monkeypatch.setattr(allocation, "ROUNDING", 0.0)  # without the allowance, rounding skips the fewest replicas
    plan, skipped = search()
    assert plan.spec_overrides != ["workers.policy.replicas=1"] and skipped > 0


def test_the_declared_simulator_processes_keep_their_place_on_a_tie_with_fewer():
    # a policy that costs a tenth of a second a call, whatever its rows: 2 and 4 simulator processes tie
    raw = spin_workflow(4, 1, 4, "shared", 2, colocate=False, trainers=1)
    raw["placement"]["search_processes"] = True
    raw["workers"]["policy"]["profile"]["act"] = {"fixed_s": 0.1, "per_item_s": 1e-5}
    raw["workers"]["env"]["profile"]["step"] = {"fixed_s": 1e-3, "per_item_s": 1e-4}
    raw["workers"]["trainer"]["profile"]["train"] = {"fixed_s": 0.0, "per_item_s": 0.0}
    graph = build_graph(spec_from_dict(raw))
    cluster = Cluster.from_spec(graph.spec.cluster)
    plan = make_plan(graph, cluster)
    tied = {row.layout for row in plan.candidates if row.feasible and row.iteration_s == plan.predicted.iteration_s}
    assert {"env 2 x 8", "env 4 x 4"} <= tied
    assert plan.spec_overrides == ["workers.env.replicas=4", "workers.env.args.num_envs=4"]
    assert (plan.spec_overrides, plan.predicted.iteration_s) == ascending_search(graph, cluster)
