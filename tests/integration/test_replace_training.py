"""A training rank killed (SIGKILL) or hung (SIGSTOP) while it trains on the iteration's batch: with
`run.on_failure: replace` the training worker alone is restarted in place from the checkpoint written right
before the iteration, its process group meets again, and it trains on the same batch; the simulators and
the policy keep their processes and state, and nothing is lost or trained twice."""

from __future__ import annotations

import re

import pytest

import m2flow as mf
from m2flow.config import spec_from_dict
from tests.workflows import recovery_ppo

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_cluster")]

HORIZON, ENVS, ITERATIONS = 16, 2, 3
FLOOR_S = 8.0  # every deadline comes from the plan, as by default, floored here to keep the test short
SILENCE_S = 3.0  # a process with no beat this long (stopped) is hung, before its call's deadline


def faulty_training(tmp_path, fault: str, checkpoint_every: int = 1) -> mf.WorkflowSpec:
    """Two simulator replicas, one policy, two training ranks; rank 1 faults as its second train call begins."""
    raw = recovery_ppo(
        tmp_path,
        f"replace-training-{fault}-{checkpoint_every}",
        horizon=HORIZON,
        iterations=ITERATIONS,
        seed=5,
        envs=ENVS,
        checkpoint_every=checkpoint_every,
        on_failure="replace",
        timeouts={"floor_s": FLOOR_S, "ceiling_s": FLOOR_S, "silence_s": SILENCE_S},
    )
    actor = raw["workers"]["actor"]
    actor["class"] = "tests.workers_for_tests.FaultyPPO"
    actor["replicas"] = 2
    actor["args"].update(fault=fault, fault_replica=1, fault_at_step=2, marker=str(tmp_path / "fault"))
    return spec_from_dict(raw)


@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_a_failed_training_rank_restarts_its_worker_in_place_on_the_same_batch(tmp_path, fault):
    result = mf.run(faulty_training(tmp_path, fault))
    struck_at = float((tmp_path / "fault").read_text())

    (failure,) = result.failures
    assert failure["replaced"] == "actor[1]" and failure["iteration"] == 1  # the rank that failed; not a restart
    detection = failure["detected_at"] - struck_at
    if fault == "kill":  # the other rank's collective breaks at once
        assert 0 <= detection < FLOOR_S, f"detected after {detection:.1f}s"
    else:  # no beat from its process: caught at the silence bound, before the call's deadline, the ranks named
        assert SILENCE_S - 1 <= detection < FLOOR_S, f"detected after {detection:.1f}s"
        assert "no beat from actor[1] for 3." in failure["error"], failure["error"]
        assert "process group of 'actor': 1 of 2 ranks in a collective" in failure["error"]
        assert re.search(r"not arrived: actor\[1\]", failure["error"]), failure["error"]

    per_iteration = 2 * ENVS * HORIZON
    assert [h["iteration"] for h in result.history] == list(range(ITERATIONS))
    assert [h["env_steps"] for h in result.history] == [per_iteration * (i + 1) for i in range(ITERATIONS)]
    assert [h["actor/steps_consumed"] for h in result.history] == [per_iteration] * ITERATIONS
    assert result.history[1]["failures/replaced"] == 1
    assert result.history[1]["failures/steps_redone"] == 0  # the batch was kept: no env step redone
    assert result.last["actor/weights_version"] == ITERATIONS  # one update per iteration: none lost or repeated


def test_without_a_checkpoint_right_before_the_iteration_a_training_failure_restarts_the_run(tmp_path):
    result = mf.run(faulty_training(tmp_path, "kill", checkpoint_every=2))

    (failure,) = result.failures
    assert failure["replaced"] is None and failure["iteration"] == 1  # iteration 0 has no checkpoint of its own
    assert [h["iteration"] for h in result.history] == list(range(ITERATIONS))
