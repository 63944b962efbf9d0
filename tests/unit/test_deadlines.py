"""The waits of a run derived from its plan: a checkpoint's hooks and the probe of a node after a failure
are held to a call's deadline, not to the workers' start-up one, and a checkpoint's deadline passes before
the collective timeout of the training groups (so that the driver names the ranks that did not arrive)."""

from __future__ import annotations

import pytest

from m2flow.runtime.deadlines import Deadlines
from m2flow.spec import TimeoutSpec
from tests.unit.test_planner import plan_of, workflow


def deadlines(**timeouts) -> Deadlines:
    """The toy workflow's (a loop of 100 steps, training declared at 0.05 s a call) under `timeouts`."""
    return Deadlines.from_plan(plan_of(workflow(horizon=100)), TimeoutSpec(**timeouts))


def test_a_checkpoint_waits_the_training_deadline_under_the_groups_collective_timeout():
    derived = deadlines(floor_s=0.5, safety_factor=20)
    assert derived.checkpoint_s == pytest.approx(20 * 0.05, rel=0.05)  # x20 the predicted update
    assert derived.checkpoint_s == derived.phase("then") < derived.collective_s == 2 * derived.phase("then")
    assert derived.checkpoint_s < derived.start_s


def test_a_node_is_probed_for_a_calls_deadline_not_a_starts():
    derived = deadlines(floor_s=0.5, safety_factor=20, start_s=300)
    assert derived.reach_s == max(derived.phase_s.values()) == derived.phase("loop")  # the loop is the longest
    assert derived.reach_s < 300


def test_the_floor_holds_every_derived_wait_up():
    derived = deadlines(floor_s=60)
    assert derived.checkpoint_s == derived.reach_s == 60 and derived.collective_s == 120
