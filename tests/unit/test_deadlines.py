"""Waits a run derives: a training group's collectives outlast its call's deadline (the driver names the
ranks first); a node is probed for a call's deadline after a failure, never a start's longer one; a
checkpoint's hooks wait a start's deadline until one checkpoint was timed, then what it measured."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from m2flow.runtime.deadlines import Deadlines
from m2flow.runtime.snapshots import Snapshots
from m2flow.spec import TimeoutSpec
from tests.unit.test_planner import plan_of, workflow


def deadlines(env_s: float = 0.002, **timeouts) -> Deadlines:
    """The toy workflow's (a loop of 100 steps of `env_s` a step, training declared at 0.05 s a call)."""
    return Deadlines.from_plan(plan_of(workflow(env_s=env_s, horizon=100)), TimeoutSpec(**timeouts))


def test_a_groups_collective_waits_twice_its_training_calls_deadline():
    derived = deadlines(floor_s=0.5, safety_factor=20)
    assert derived.phase("then") == pytest.approx(20 * 0.05, rel=0.05)  # x20 the predicted update
    assert derived.collective_s == 2 * derived.phase("then")


def test_a_node_is_probed_for_the_longest_calls_deadline_and_never_longer_than_a_start():
    quick = deadlines(floor_s=0.5, start_s=300)
    assert quick.reach_s == quick.phase("loop") == max(quick.phase_s.values()) < 30
    slow = deadlines(env_s=10.0, floor_s=0.5, start_s=300)  # a loop predicted at 1,000 s: its deadline 3,600
    assert slow.phase("loop") == 3600 and slow.reach_s == 300


def metaworld_deadlines(*overrides: str, **timeouts) -> tuple[Deadlines, float]:
    """The Meta-World camera job's deadlines (its evaluation syncs one iteration in 25), and its predicted sync."""
    from m2flow.cluster import Cluster
    from m2flow.config import load_spec
    from m2flow.graph import build_graph
    from m2flow.planners import make_plan
    from tests.conftest import ROOT

    spec = load_spec(ROOT / "configs/ppo_metaworld_camera.yaml", ["cluster.gpus=0", "cluster.cpus=2", *overrides])
    plan = make_plan(build_graph(spec), Cluster.from_spec(spec.cluster))
    return Deadlines.from_plan(plan, TimeoutSpec(**timeouts)), plan.predicted.phase_s["sync"]


def test_an_unmeasured_evaluation_synced_every_25_iterations_waits_a_start_and_the_weight_sync_its_phases(
    monkeypatch, tmp_path
):
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(tmp_path))  # nothing measured: the evaluation's cost is a guess
    derived, _ = metaworld_deadlines(start_s=180, floor_s=60)
    assert derived.sync("actor.weights -> env.evaluate") == 180  # two filmed episodes took 62 s here (session 36)
    assert derived.sync("actor.weights -> rollout.load_weights") == derived.phase("sync") == 60
    assert "run.timeouts.start_s" in derived.explain
    declared, sync_s = metaworld_deadlines("workers.env.profile.evaluate.fixed_s=2.0", start_s=1000, floor_s=1)
    assert declared.sync("actor.weights -> env.evaluate") == pytest.approx(20 * 25 * sync_s)  # when it runs, x20
    assert 40 < declared.sync("actor.weights -> env.evaluate") < 1000  # its cost known: no start's wait
    assert declared.phase("sync") == pytest.approx(20 * sync_s)


def test_the_first_checkpoint_waits_a_start_and_later_ones_the_last_ones_time_x_safety_within_the_bounds():
    timeouts = TimeoutSpec(start_s=300, floor_s=10, ceiling_s=1000, safety_factor=20)
    snapshots = Snapshots(graph=None, launch=SimpleNamespace(timeouts=timeouts))
    assert snapshots.saving_s == 300  # nothing timed yet: a large state may take what a start may
    for took_s, deadline_s in ((0.1, 10), (2.0, 40), (80.0, 1000)):
        snapshots.saved_in_s = took_s
        assert snapshots.saving_s == pytest.approx(deadline_s)
