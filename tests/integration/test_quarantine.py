"""Quarantine: an env that crashes its simulator replica at every reset from its seed costs two replacements
and a new seed, not the job; one that crashes whatever its seed stops the run with its name once the
replacements run out."""

from __future__ import annotations

import re

import pytest

import m2flow as mf
from m2flow.config import spec_from_dict
from tests.workflows import recovery_ppo

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_cluster")]

HORIZON, ENVS, ITERATIONS, SEED, BAD_ENV = 8, 2, 2, 5, 3
ENV_ID = "tests.workers_for_tests:InvertedPendulumBadStarts-v0"


def bad_starts_ppo(
    tmp_path,
    bad_seeds,
    env_id: str = ENV_ID,
    iterations: int = ITERATIONS,
    crash: str = "raise",
    on_failure: str = "replace",
    **run,
) -> mf.WorkflowSpec:
    """Two simulator replicas of 2 envs (envs 0-3) whose reset fails from `bad_seeds` (raises, or segfaults)."""
    raw = recovery_ppo(
        tmp_path,
        "quarantine",
        horizon=HORIZON,
        iterations=iterations,
        seed=SEED,
        envs=ENVS,
        on_failure=on_failure,
        quarantine_after=2,
        timeouts={"floor_s": 8.0},
        **run,
    )
    for worker in raw["workers"].values():
        worker["args"]["env_id"] = env_id
    raw["workers"]["env"]["args"]["env_kwargs"] = {"bad_seeds": bad_seeds, "crash": crash}
    return spec_from_dict(raw)


def test_an_env_that_always_crashes_at_reset_from_its_seed_is_quarantined_and_the_run_goes_on(tmp_path, capsys):
    result = mf.run(bad_starts_ppo(tmp_path, [SEED + BAD_ENV]))

    first, second = result.failures  # its replica failed at the first reset, then again in the redo
    assert [f["replaced"] for f in result.failures] == ["env[1]", "env[1]"]
    assert [f["env"] for f in result.failures] == [BAD_ENV, BAD_ENV]
    assert [f["quarantined"] for f in result.failures] == [False, True]
    assert first["error"].endswith("env 3 failed: reset raised RuntimeError: infeasible initial state from seed 8")
    per_iteration = 2 * ENVS * HORIZON
    assert [h["env_steps"] for h in result.history] == [per_iteration * (i + 1) for i in range(ITERATIONS)]
    assert result.history[0]["failures/quarantined"] == 1
    assert result.history[0]["actor/steps_consumed"] == per_iteration  # training saw the whole batch
    assert second["steps_redone"] == ENVS * HORIZON and first["steps_redone"] == 0
    out = " ".join(capsys.readouterr().err.split())  # the console wraps lines
    assert "env[1] failed in iteration 0 (env 3)" in out
    assert "env 3 quarantined: started from a new seed" in out


def test_an_env_that_segfaults_its_replica_at_reset_is_quarantined_as_one_that_raises(tmp_path):
    result = mf.run(bad_starts_ppo(tmp_path, [SEED + BAD_ENV], crash="segfault"))

    first, second = result.failures  # its replica crashed at the first reset, then again in the redo
    assert [f["replaced"] for f in result.failures] == ["env[1]", "env[1]"]
    assert [f["env"] for f in result.failures] == [BAD_ENV, BAD_ENV]  # named by the crash record, not by itself
    assert [f["quarantined"] for f in result.failures] == [False, True]
    assert "worker 'env' replica 1 died during the loop" in first["error"], first["error"]
    assert "it crashed: Segmentation fault while working on env 3" in first["error"], first["error"]
    per_iteration = 2 * ENVS * HORIZON
    assert [h["env_steps"] for h in result.history] == [per_iteration * (i + 1) for i in range(ITERATIONS)]
    assert result.history[0]["actor/steps_consumed"] == per_iteration


def test_a_run_stopped_by_a_segfault_says_which_env_its_process_crashed_in(tmp_path):
    spec = bad_starts_ppo(tmp_path, [SEED + BAD_ENV], crash="segfault", on_failure="stop")

    with pytest.raises(mf.WorkerError) as caught:
        mf.run(spec)
    message = str(caught.value)
    # the death is seen first either by Ray (the actor died) or by its loop peer (its channel closed)
    died = "worker 'env' replica 1 died during the loop" in message
    assert died or "env[1] closed its channel while we waited" in message, message
    assert "env[1]: it crashed: Segmentation fault while working on env 3 (its stacks: " in message, message


def test_a_resumed_run_starts_a_quarantined_env_from_its_new_seed(tmp_path):
    not_mujoco = "tests.workers_for_tests:PendulumBadStarts-v0"  # no simulator state checkpointed: reset from seeds
    first = mf.run(bad_starts_ppo(tmp_path, [SEED + BAD_ENV], not_mujoco))
    assert [f["quarantined"] for f in first.failures] == [False, True]

    resumed = mf.run(bad_starts_ppo(tmp_path, [SEED + BAD_ENV], not_mujoco, ITERATIONS + 1, resume=True))

    assert resumed.failures == []  # its old seed would fail the first reset again
    assert [h["iteration"] for h in resumed.history] == [ITERATIONS]


def test_an_env_that_crashes_whatever_its_seed_stops_the_run_naming_it_when_replacements_run_out(tmp_path):
    spec = bad_starts_ppo(tmp_path, "all", max_replacements=4, max_restarts=0)

    # both replicas fail at every reset: replaced, replaced and quarantined, then no replacement is left
    with pytest.raises(mf.WorkerError) as caught:
        mf.run(spec)
    message = str(caught.value)
    assert "failed in the loop" in message and "no in-place replacement left (run.max_replacements)" in message
    assert "reset raised RuntimeError: infeasible initial state" in message
    assert re.search(r"env \d still fails after 1 quarantine\(s\) from new seeds", message)
