"""Recovery in place: a simulator replica killed (SIGKILL) or hung (SIGSTOP) in the middle of the loop, as it
hands over its trajectory, or as a checkpoint gathers its state, is replaced on its planned device and only
its part of the iteration is redone; the other replicas keep their steps, training sees a whole batch, and
nothing restarts."""

from __future__ import annotations

import pytest

import m2flow as mf
from m2flow.config import spec_from_dict
from m2flow.runtime.checkpoint import load_checkpoint
from tests.workflows import recovery_ppo

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_cluster")]

HORIZON, ENVS, ITERATIONS = 16, 2, 3
FLOOR_S = 8.0  # every deadline comes from the plan, as by default, floored here to keep the test short
SILENCE_S = 3.0  # a loop peer silent this long (stopped: no beat) is hung, before its channel deadline


def faulty_ppo(tmp_path, fault: str, state: str, fault_in: str = "step", at_step: int = 6) -> mf.WorkflowSpec:
    """Two simulator replicas of 2 envs; replica 1 faults at step `at_step` of iteration 1 (or, after that
    iteration's loop, in its metrics() call or as it hands over its trajectory)."""
    raw = recovery_ppo(
        tmp_path,
        f"replace-{fault}",
        horizon=HORIZON,
        iterations=ITERATIONS,
        seed=3,
        envs=ENVS,
        checkpoint_every=1,
        on_failure="replace",
        replacement_state=state,
        timeouts={"floor_s": FLOOR_S, "silence_s": SILENCE_S},
    )
    env = raw["workers"]["env"]
    env["class"] = "tests.workers_for_tests.FaultyGymEnv"
    env["args"].update(
        fault=fault, fault_replica=1, fault_at_step=HORIZON + at_step, marker=str(tmp_path / "fault"), fault_in=fault_in
    )
    return spec_from_dict(raw)


@pytest.mark.parametrize(("fault", "state"), [("kill", "reset"), ("stop", "checkpoint")])
def test_a_failed_simulator_is_replaced_in_place_and_only_its_part_is_redone(tmp_path, fault, state):
    result = mf.run(faulty_ppo(tmp_path, fault, state))
    struck_at = float((tmp_path / "fault").read_text())

    (failure,) = result.failures  # one failure, and it was not a restart (a restart records replaced: None)
    assert failure["replaced"] == "env[1]" and failure["iteration"] == 1
    if state == "reset":  # new episodes, on the observation scale the policy learned on
        assert failure["state"] == "its envs reset, their statistics from iter_00000000"
    else:
        assert failure["state"] == "its envs restored from iter_00000000"
    detection = failure["detected_at"] - struck_at
    if fault == "kill":  # the channel closes at once
        assert 0 <= detection < FLOOR_S, f"detected after {detection:.1f}s"
    else:  # a stopped process sends nothing, not even a beat: caught at the silence bound, before the channel's
        assert SILENCE_S - 1 <= detection < FLOOR_S, f"detected after {detection:.1f}s"
        assert "no word from env[1] for 3s (no data, no beat: its process is stopped" in failure["error"]

    per_iteration = 2 * ENVS * HORIZON
    assert [h["env_steps"] for h in result.history] == [per_iteration * (i + 1) for i in range(ITERATIONS)]
    faulted = result.history[1]
    assert faulted["failures/replaced"] == 1
    assert faulted["failures/steps_redone"] == ENVS * HORIZON  # the replaced replica's share, no more
    assert faulted["actor/steps_consumed"] == per_iteration  # training saw the whole batch
    assert result.last["actor/weights_version"] == ITERATIONS  # one update per iteration: none repeated


@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_a_simulator_that_fails_between_loops_is_replaced_in_place_with_nothing_to_redo(tmp_path, fault):
    result = mf.run(faulty_ppo(tmp_path, fault, "checkpoint", fault_in="metrics"))
    struck_at = float((tmp_path / "fault").read_text())

    (failure,) = result.failures  # replaced, not restarted
    assert failure["replaced"] == "env[1]" and failure["iteration"] == 1
    assert "metrics()" in failure["error"]
    assert 0 <= failure["detected_at"] - struck_at < (1 if fault == "kill" else 3) * FLOOR_S + 1
    per_iteration = 2 * ENVS * HORIZON
    assert [h["env_steps"] for h in result.history] == [per_iteration * (i + 1) for i in range(ITERATIONS)]
    assert result.history[1]["failures/steps_redone"] == 0  # its trajectory had been delivered
    assert [h["actor/steps_consumed"] for h in result.history] == [per_iteration] * ITERATIONS
    assert result.last["actor/weights_version"] == ITERATIONS


@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_a_simulator_that_fails_handing_over_its_trajectory_is_replaced_and_its_part_redone(tmp_path, fault):
    result = mf.run(faulty_ppo(tmp_path, fault, "reset", fault_in="handover"))

    (failure,) = result.failures  # replaced, not restarted
    assert failure["replaced"] == "env[1]" and failure["iteration"] == 1
    # seen by the handover's wait (a stopped process: no beat for the silence bound), or by the loop's when its
    # result was still on its way as the process went (a killed process: its loop call died; a stopped one: its
    # loop call is still out at the loop's deadline)
    seen_by = ("env.trajectory", "during the loop", "still in the loop", "no beat from env[1] for 3.")
    assert any(seen in failure["error"] for seen in seen_by), failure["error"]
    per_iteration = 2 * ENVS * HORIZON
    assert [h["env_steps"] for h in result.history] == [per_iteration * (i + 1) for i in range(ITERATIONS)]
    assert result.history[1]["failures/steps_redone"] == ENVS * HORIZON  # its steps went with its trajectory
    assert [h["actor/steps_consumed"] for h in result.history] == [per_iteration] * ITERATIONS
    assert result.last["actor/weights_version"] == ITERATIONS


@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_a_simulator_lost_as_a_checkpoint_gathers_its_state_is_replaced_in_place_and_the_checkpoint_written(
    tmp_path, fault
):
    result = mf.run(faulty_ppo(tmp_path, fault, "reset", fault_in="checkpoint"))
    struck_at = float((tmp_path / "fault").read_text())

    (failure,) = result.failures  # replaced, not restarted (a restart records replaced: None)
    assert failure["replaced"] == "env[1]" and failure["iteration"] == 1
    assert "state_dict()" in failure["error"]
    # a kill is seen at once, a hang at the checkpoint's deadline (floored at FLOOR_S)
    assert 0 <= failure["detected_at"] - struck_at < (1 if fault == "kill" else 3) * FLOOR_S + 1
    assert result.history[1]["failures/replaced"] == 1 and result.history[1]["failures/steps_redone"] == 0
    state, meta = load_checkpoint(result.run_dir / "checkpoints" / "iter_00000001")
    kept, replacement = state["env"]
    assert meta["iteration"] == 1 and all(kept)  # env[0]'s physics, mid-episode
    assert replacement == [{}]  # the replacement's: its envs start anew on their next observation
    per_iteration = 2 * ENVS * HORIZON
    assert [h["env_steps"] for h in result.history] == [per_iteration * (i + 1) for i in range(ITERATIONS)]
    assert [h["actor/steps_consumed"] for h in result.history] == [per_iteration] * ITERATIONS
    assert result.last["actor/weights_version"] == ITERATIONS


def test_a_simulator_hung_in_its_last_step_where_no_peer_waits_on_it_is_replaced_a_channel_deadline_after_its_peers(
    tmp_path,
):
    # replica 1 stops in its last step of iteration 1: nothing is sent on after it, so no peer waits on it
    result = mf.run(faulty_ppo(tmp_path, "stop", "reset", at_step=HORIZON))
    struck_at = float((tmp_path / "fault").read_text())

    (failure,) = result.failures  # replaced, not restarted
    assert failure["replaced"] == "env[1]" and failure["iteration"] == 1
    # its beat file says it stopped beating (SIGSTOP)
    assert "env[1] still in the loop (no beat for " in failure["error"], failure["error"]
    assert "after its peers finished theirs" in failure["error"]
    # a channel deadline (floored at FLOOR_S) once the policy finished its loop, not the whole loop's deadline
    # (its phase's plus a channel deadline for each replica its peers may wait out: at least 3 x FLOOR_S here); the
    # deadline starts as the policy finishes its loop, a few ms before env[1] steps and writes the fault's time
    assert FLOOR_S - 0.5 <= failure["detected_at"] - struck_at < 2 * FLOOR_S
    per_iteration = 2 * ENVS * HORIZON
    assert [h["env_steps"] for h in result.history] == [per_iteration * (i + 1) for i in range(ITERATIONS)]
    assert result.history[1]["failures/steps_redone"] == ENVS * HORIZON
    assert [h["actor/steps_consumed"] for h in result.history] == [per_iteration] * ITERATIONS
    assert result.last["actor/weights_version"] == ITERATIONS
