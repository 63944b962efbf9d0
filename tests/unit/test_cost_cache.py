"""The cost cache: what the latest runs measured of each port, kept per batch size and run, the median standing;
entries written before runs were kept or damaged read back without a crash; the keys the planner's knobs leave out."""

from __future__ import annotations

import json

import pytest

from m2flow.config import spec_from_dict
from m2flow.graph import build_graph
from m2flow.planners.cache import (
    RUNS_KEPT,
    CachedFit,
    cached_fits,
    load_cached,
    save_cached,
    worker_key,
    workflow_key,
)
from m2flow.planners.fit import fit_points
from tests.unit.test_planner import workflow


def test_the_cache_keeps_every_batch_size_runs_measured_and_fits_across_them(tmp_path, monkeypatch):
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(tmp_path))
    graph = build_graph(spec_from_dict(workflow()))
    kinds = {"env": "cpu"}
    for run, items in ((1, 4), (2, 2)):  # a step costs 3 ms a call whatever its slice: a per-call cost
        save_cached(graph, kinds, fit_points({"env.step": [(items, 0.003)] * 3}, f"run {run}")["ports"])
    cached = load_cached(graph, kinds)["env.step"]
    assert cached.fixed_s == pytest.approx(0.003) and cached.per_item_s == 0.0


def save_step_cost(graph, seconds: float, items: int = 4, run: str | None = None) -> None:
    save_cached(graph, {"env": "cpu"}, fit_points({"env.step": [(items, seconds)] * 3}, "a run")["ports"], run)


def cached_step_s(graph, items: int = 4) -> float:
    cost = load_cached(graph, {"env": "cpu"})["env.step"].cost
    return cost.fixed_s + cost.per_item_s * items


def cached_step_fit(graph) -> CachedFit:
    return cached_fits(graph, {"env": "cpu"})["env.step"]


def test_one_slow_run_moves_no_cached_cost_the_runs_before_it_agree_on(tmp_path, monkeypatch):
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(tmp_path))
    graph = build_graph(spec_from_dict(workflow()))
    for seconds in (0.003, 0.003, 0.003, 0.0045):
        save_step_cost(graph, seconds)
    assert cached_step_s(graph) == pytest.approx(0.003)


def test_a_lasting_change_in_cost_is_followed_once_most_kept_runs_measured_it(tmp_path, monkeypatch):
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(tmp_path))
    graph = build_graph(spec_from_dict(workflow()))
    for seconds in (0.003,) * (RUNS_KEPT + 1) + (0.006,) * (RUNS_KEPT // 2):
        save_step_cost(graph, seconds)
    assert cached_step_s(graph) < 0.006  # a minority of the kept runs
    save_step_cost(graph, 0.006)
    assert cached_step_s(graph) == pytest.approx(0.006)
    seen = cached_step_fit(graph).seen
    assert len(seen) == RUNS_KEPT and [row.value for row in seen][-3:] == [pytest.approx(0.006)] * 3


def test_a_run_that_saves_again_replaces_what_it_saved_before(tmp_path, monkeypatch):
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(tmp_path))
    graph = build_graph(spec_from_dict(workflow()))
    for seconds in (0.003, 0.003):
        save_step_cost(graph, seconds)
    for seconds in (0.006, 0.004):  # at its re-plan, then at its end: one run, its last value among three
        save_step_cost(graph, seconds, run="this run")
    seen = cached_step_fit(graph).seen
    assert [(row.run, row.value) for row in seen if row.run == "this run"] == [("this run", 0.004)]
    assert len(seen) == 3 and cached_step_s(graph) == pytest.approx(0.003)


def test_a_run_saved_at_its_replan_and_again_at_its_end_at_more_sizes_counts_once_at_each(tmp_path, monkeypatch):
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(tmp_path))
    graph = build_graph(spec_from_dict(workflow()))
    save_step_cost(graph, 0.003, items=4, run="an earlier run")
    save_step_cost(graph, 0.0031, items=4, run="this run")  # its re-plan, before a switch to slices of 2 envs
    points = {"env.step": [(4, 0.0033)] * 3 + [(2, 0.002)] * 3}  # its end: both sizes, from the whole trace
    save_cached(graph, {"env": "cpu"}, fit_points(points, "this run")["ports"], "this run")
    seen = sorted((row.run, row.items, row.value) for row in cached_step_fit(graph).seen)
    assert seen == [
        ("an earlier run", 4, pytest.approx(0.003)),
        ("this run", 2, 0.002),
        ("this run", 4, pytest.approx(0.0033)),
    ]


def test_a_cache_entry_from_before_runs_were_kept_or_damaged_counts_as_one_earlier_run(tmp_path, monkeypatch):
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(tmp_path))
    graph = build_graph(spec_from_dict(workflow()))
    save_step_cost(graph, 0.003)
    (path,) = tmp_path.glob("*.json")
    written = json.loads(path.read_text())["ports"]["step"]
    assert list(written) == [
        "fixed_s",
        "per_item_s",
        "calls",
        "batch_sizes",
        "by_size",
        "residual",
        "replica_shares",
        "seen",
    ]
    for seen in (None, "damaged"):
        entry = json.loads(path.read_text())
        fit = {key: value for key, value in entry["ports"]["step"].items() if key != "seen"}  # as written before
        if seen is not None:
            fit["seen"] = seen
        path.write_text(json.dumps({**entry, "ports": {"step": fit}}))
        for seconds in (0.003, 0.009):
            save_step_cost(graph, seconds)
        assert [row.value for row in cached_step_fit(graph).seen] == pytest.approx([0.003, 0.003, 0.009])
        assert cached_step_s(graph) == pytest.approx(0.003)


def test_a_cache_entry_whose_fit_is_damaged_reads_as_not_cached_and_is_measured_again(tmp_path, monkeypatch):
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(tmp_path))
    graph = build_graph(spec_from_dict(workflow()))
    save_step_cost(graph, 0.003)
    (path,) = tmp_path.glob("*.json")
    entry = json.loads(path.read_text())
    step = {**entry["ports"]["step"], "by_size": [[4, "damaged", 3]]}
    path.write_text(json.dumps({**entry, "ports": {"step": step}}))
    assert cached_fits(graph, {"env": "cpu"}) == {}
    save_step_cost(graph, 0.006)
    assert [row.value for row in cached_step_fit(graph).seen] == [pytest.approx(0.006)]


def test_a_slow_run_at_one_batch_size_does_not_tilt_the_line_across_sizes(tmp_path, monkeypatch):
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(tmp_path))
    graph = build_graph(spec_from_dict(workflow()))
    for items in (2, 4, 2, 4, 2):  # a step costs 1 ms a call and 0.5 ms an env
        save_step_cost(graph, 0.001 + 0.0005 * items, items)
    steady = load_cached(graph, {"env": "cpu"})["env.step"].cost
    assert [steady.fixed_s + steady.per_item_s * n for n in (2, 4)] == pytest.approx([0.002, 0.003], rel=0.05)
    save_step_cost(graph, 3 * (0.001 + 0.0005 * 2), 2)  # one run three times slower at the small size
    assert load_cached(graph, {"env": "cpu"})["env.step"].cost == steady


def test_the_cache_keys_leave_out_replicas_and_envs_per_replica_which_the_planner_may_set():
    planned = build_graph(spec_from_dict(workflow(env_replicas=2, num_envs=4)))
    declared = build_graph(spec_from_dict(workflow(env_s=0.004, policy_s=0.004, env_replicas=1, num_envs=8)))
    assert worker_key(planned, "env", "cpu") == worker_key(declared, "env", "cpu")
    assert workflow_key(planned) == workflow_key(declared)  # its hop, controller time and slowdown carry over
    other = workflow(env_replicas=2, num_envs=4)
    other["flow"]["loop"]["horizon"] = 50
    assert workflow_key(build_graph(spec_from_dict(other))) != workflow_key(planned)
