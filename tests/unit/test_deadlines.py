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


def test_the_first_checkpoint_waits_a_start_and_later_ones_the_last_ones_time_x_safety_within_the_bounds():
    timeouts = TimeoutSpec(start_s=300, floor_s=10, ceiling_s=1000, safety_factor=20)
    snapshots = Snapshots(graph=None, launch=SimpleNamespace(timeouts=timeouts))
    assert snapshots.saving_s == 300  # nothing timed yet: a large state may take what a start may
    for took_s, deadline_s in ((0.1, 10), (2.0, 40), (80.0, 1000)):
        snapshots.saved_in_s = took_s
        assert snapshots.saving_s == pytest.approx(deadline_s)
