"""Recovery in place of an inference replica: killed (SIGKILL) or hung (SIGSTOP) in the middle of the loop,
it is replaced on its planned device and given the current weights (its weight-sync group meets again);
the simulators it left unfinished are replaced with it and only their part of the iteration is redone, the
other policy replica's simulators keep theirs. Between loops (SIGKILL), or in the weight sync (SIGKILL or
SIGSTOP), it is replaced with nothing to redo and the sync done again. Training sees whole batches, acts on
no stale weights, and nothing restarts."""

from __future__ import annotations

import pytest

import m2flow as mf
from m2flow.config import spec_from_dict
from m2flow.runtime.checkpoint import load_checkpoint
from tests.workflows import recovery_ppo

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_cluster")]

HORIZON, ENVS, SIMULATORS, ITERATIONS = 16, 2, 2, 3  # SIMULATORS: as recovery_ppo has them
FLOOR_S = 6.0  # every deadline comes from the plan, as by default, floored here to keep the test short
SILENCE_S = 2.0  # a loop peer silent this long (stopped: no beat) is hung, before its channel deadline


def replacing_ppo(tmp_path, name: str, on_failure: str = "replace") -> dict:
    """The recovery job with `run.on_failure: replace`, a checkpoint every iteration, deadlines floored."""
    return recovery_ppo(
        tmp_path,
        name,
        horizon=HORIZON,
        iterations=ITERATIONS,
        seed=3,
        envs=ENVS,
        checkpoint_every=1,
        on_failure=on_failure,
        timeouts={"floor_s": FLOOR_S, "silence_s": SILENCE_S},
    )


def faulty_policy_ppo(
    tmp_path, fault: str, fault_in: str, policies: int = 1, on_failure: str = "replace", ranks: int = 1
) -> mf.WorkflowSpec:
    """Two simulator replicas of 2 envs, `policies` policy replicas and `ranks` training ranks; policy
    replica 0 faults at its step 6 of iteration 1 (or in the metrics() call after that iteration's loop, or
    in the weight sync of iteration 2)."""
    raw = replacing_ppo(tmp_path, f"replace-policy-{fault}-{fault_in}-{policies}-{on_failure}-{ranks}", on_failure)
    raw["workers"]["actor"]["replicas"] = ranks
    policy = raw["workers"]["rollout"]
    policy["replicas"] = policies
    policy["class"] = "tests.workers_for_tests.FaultyPolicy"
    policy["args"].update(fault=fault, fault_at_step=HORIZON + 6, marker=str(tmp_path / "fault"), fault_in=fault_in)
    return spec_from_dict(raw)


def assert_whole_batches(result: mf.RunResult) -> None:
    per_iteration = SIMULATORS * ENVS * HORIZON
    assert [h["env_steps"] for h in result.history] == [per_iteration * (i + 1) for i in range(ITERATIONS)]
    assert [h["actor/steps_consumed"] for h in result.history] == [per_iteration] * ITERATIONS
    assert result.last["actor/weights_version"] == ITERATIONS  # one update per iteration: none repeated
    assert [h["actor/staleness_max"] for h in result.history] == [0] * ITERATIONS  # replacements got the weights


@pytest.mark.parametrize(("fault", "policies", "ranks"), [("kill", 2, 1), ("stop", 1, 1), ("kill", 2, 2)])
def test_a_failed_policy_replica_is_replaced_in_place_with_the_simulators_it_left_unfinished(
    tmp_path, fault, policies, ranks
):
    # with two training ranks, the other simulator's part reaches its rank before the replacement is given
    # the weights (a collective on both ranks): a part may not hold a rank in a collective of its own
    result = mf.run(faulty_policy_ppo(tmp_path, fault, "step", policies, ranks=ranks))
    struck_at = float((tmp_path / "fault").read_text())

    served = ["env[0]"] if policies == 2 else ["env[0]", "env[1]"]  # the simulators policy replica 0 serves
    assert all(f["replaced"] for f in result.failures)  # no restart (a restart records replaced: None)
    assert sorted(f["replaced"] for f in result.failures) == [*served, "rollout[0]"]
    assert {f["iteration"] for f in result.failures} == {1}
    (policy,) = [f for f in result.failures if f["replaced"] == "rollout[0]"]
    detection = policy["detected_at"] - struck_at
    if fault == "kill":  # the channel closes at once
        assert 0 <= detection < FLOOR_S, f"detected after {detection:.1f}s"
    else:  # silent, not even a beat: caught at the silence bound, before its channel deadline
        assert SILENCE_S - 1 <= detection < FLOOR_S, f"detected after {detection:.1f}s"
        assert "no word from rollout[0] for 2s (no data, no beat: its process is stopped" in policy["error"]

    faulted = result.history[1]
    assert faulted["failures/replaced"] == len(served) + 1
    assert faulted["failures/steps_redone"] == len(served) * ENVS * HORIZON  # the shards cut short, no more
    assert_whole_batches(result)


def test_a_policy_replica_that_dies_between_loops_is_replaced_with_nothing_to_redo(tmp_path):
    result = mf.run(faulty_policy_ppo(tmp_path, "kill", "metrics"))

    (failure,) = result.failures
    assert failure["replaced"] == "rollout[0]" and failure["iteration"] == 1
    assert result.history[1]["failures/steps_redone"] == 0
    assert_whole_batches(result)


def test_a_policy_replica_killed_as_a_checkpoint_gathers_its_state_is_replaced_in_place(tmp_path):
    result = mf.run(faulty_policy_ppo(tmp_path, "kill", "checkpoint"))

    (failure,) = result.failures  # replaced, not restarted
    assert failure["replaced"] == "rollout[0]" and failure["iteration"] == 1 and "state_dict()" in failure["error"]
    assert result.history[1]["failures/replaced"] == 1 and result.history[1]["failures/steps_redone"] == 0
    state, _ = load_checkpoint(result.run_dir / "checkpoints" / "iter_00000001")
    assert state["rollout"][0] is not None  # the replacement's noise streams
    assert_whole_batches(result)


@pytest.mark.parametrize(("fault", "policies"), [("kill", 2), ("stop", 1)])
def test_a_policy_replica_that_fails_in_the_weight_sync_is_replaced_and_synced_again(tmp_path, fault, policies):
    result = mf.run(faulty_policy_ppo(tmp_path, fault, "sync", policies))
    struck_at = float((tmp_path / "fault").read_text())

    (failure,) = result.failures
    assert failure["replaced"] == "rollout[0]" and failure["iteration"] == 2
    assert "load_weights" in failure["error"]
    detection = failure["detected_at"] - struck_at
    if fault == "stop":  # silent: caught at the sync phase's deadline, naming the sync group's ranks
        assert "still in sync" in failure["error"]
        assert_names_the_sync_group(failure["error"], finished=["actor[0]"])  # the one policy replica is out
        assert FLOOR_S - 1 <= detection < 3 * FLOOR_S, f"detected after {detection:.1f}s"
    else:
        assert 0 <= detection < FLOOR_S, f"detected after {detection:.1f}s"
    assert result.history[2]["failures/steps_redone"] == 0
    assert_whole_batches(result)


def test_a_sync_source_that_dies_as_it_publishes_restarts_the_run_and_replaces_no_receiver(tmp_path):
    raw = replacing_ppo(tmp_path, "replace-source")
    raw["workers"]["actor"]["class"] = "tests.workers_for_tests.FaultyPPO"
    raw["workers"]["actor"]["args"].update(fault_in="sync", fault_at_step=1, marker=str(tmp_path / "fault"))
    result = mf.run(spec_from_dict(raw))

    (failure,) = result.failures  # every copy waited on what the source was to publish: not theirs
    assert failure["replaced"] is None and failure["iteration"] == 1
    assert "worker 'actor' replica 0 died during port actor.weights" in failure["error"]  # not in a resync
    assert_whole_batches(result)


def test_a_policy_replica_hung_in_the_weight_sync_without_replacement_names_the_sync_group_and_restarts(tmp_path):
    result = mf.run(faulty_policy_ppo(tmp_path, "stop", "sync", on_failure="restart"))

    (failure,) = result.failures
    assert failure["replaced"] is None and failure["iteration"] == 2  # recovered by a restart
    assert_names_the_sync_group(failure["error"], finished=["actor[0]"])
    assert [h["iteration"] for h in result.history] == list(range(ITERATIONS))


def assert_names_the_sync_group(error: str, finished: list[str]) -> None:
    """The error names the weight sync's group, its ranks done and the stopped policy replica still out."""
    group = "process group of 'sync actor.weights -> rollout.load_weights'"
    assert f"{group}: 0 of {len(finished) + 1} ranks in a collective; finished: {', '.join(finished)}" in error, error
    assert "not arrived: rollout[0] no answer within 2s: stopped, or hung outside Python" in error, error
