"""Merging pipeline slices into one call of a port paid per call (`planners/merging.py`): which ports merge,
what the plan predicts for them, and what a worker must declare."""

from __future__ import annotations

import pytest

from m2flow.planners.profile import CHANNEL_HOP_S
from m2flow.schedule import Plan
from tests.unit.test_planner import plan_of, workflow

STEP_S = 0.001  # one env stepped
CALL_S = 0.010  # the policy's call, per call or per row


def four_slices(policy: str = "PlusOne", fixed_s: float = CALL_S, per_item_s: float = 0.0) -> Plan:
    """One simulator of 4 envs on one core, cut into 4 slices of one env; the policy on the other core."""
    raw = workflow(cpus=2, mode="hybrid", stages=4, num_envs=4)
    raw["workers"]["env"]["profile"] = {"step": {"per_item_s": STEP_S}}
    raw["workers"]["policy"]["class"] = f"tests.workers_for_tests.{policy}"
    raw["workers"]["policy"]["profile"] = {"act": {"fixed_s": fixed_s, "per_item_s": per_item_s}}
    return plan_of(raw)


def test_a_policy_paid_per_call_takes_the_slices_arrived_into_its_call_and_two_calls_make_a_step():
    plan = four_slices()
    assert plan.merge_slices == ["policy.act"]
    # Steady state: slice 0's actions come alone (slices 1-3 are still being stepped when the policy starts it),
    # then slices 1-3 arrive while it works and go into the next call: two calls a step, each receiving its
    # slices' messages (one hop each), instead of four.
    assert plan.predicted.loop_step_s == pytest.approx(2 * CALL_S + 4 * CHANNEL_HOP_S, rel=1e-6)
    taken_in = [t for t in plan.tasks if t.port == "act" and t.step >= 2 and t.end == t.start]
    assert {t.stage for t in taken_in} == {2, 3}
    assert any("policy.act takes into one call the later slices arrived" in note for note in plan.notes)


def test_a_worker_that_declares_no_batch_invariance_is_called_slice_by_slice():
    plan = four_slices("PlusOnePerSlice")
    assert plan.merge_slices == []
    assert plan.predicted.loop_step_s == pytest.approx(4 * (CALL_S + CHANNEL_HOP_S), rel=1e-6)
    assert not any(note.startswith("slices:") for note in plan.notes)


def test_a_policy_paid_per_row_calls_each_slice_apart_and_the_plan_says_why():
    plan = four_slices(fixed_s=0.0, per_item_s=CALL_S)
    assert plan.merge_slices == []
    assert any("policy.act calls each slice apart" in note and "(mostly per row)" in note for note in plan.notes)


def test_merge_slices_round_trip_through_the_plan_file():
    plan = four_slices()
    assert Plan.from_dict(plan.to_dict()).merge_slices == ["policy.act"]


@pytest.mark.parametrize(("setting", "per_call", "merged"), [(False, True, []), (True, False, ["policy.act"])])
def test_placement_merge_slices_overrides_what_the_costs_say_and_the_plan_names_the_key(setting, per_call, merged):
    raw_costs = {"fixed_s": CALL_S, "per_item_s": 0.0} if per_call else {"fixed_s": 0.0, "per_item_s": CALL_S}
    raw = workflow(cpus=2, mode="hybrid", stages=4, num_envs=4)
    raw["workers"]["policy"]["profile"] = {"act": raw_costs}
    raw["placement"]["merge_slices"] = setting
    plan = plan_of(raw)
    assert plan.merge_slices == merged
    assert any(f"(placement.merge_slices: {str(setting).lower()})" in note for note in plan.notes)
