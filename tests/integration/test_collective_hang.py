"""A training rank that hangs mid-update (its process stopped): the other rank waits in a collective; the
stopped process gives no beat for `run.timeouts.silence_s`, before the training call's plan-derived deadline,
and the run names the group, the rank that arrived and the one that did not, and recovers by a restart from
the last checkpoint."""

from __future__ import annotations

import re

import pytest

import m2flow as mf
from m2flow.config import spec_from_dict
from tests.workflows import recovery_ppo

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_cluster")]

FLOOR_S, SILENCE_S, ITERATIONS = 8.0, 3.0, 3


def test_a_training_rank_hung_in_an_update_is_named_against_the_rank_in_the_collective_and_the_run_restarts(
    tmp_path,
):
    raw = recovery_ppo(
        tmp_path,
        "rank-hang",
        horizon=16,
        iterations=ITERATIONS,
        seed=4,
        checkpoint_every=1,
        on_failure="restart",
        timeouts={"floor_s": FLOOR_S, "ceiling_s": FLOOR_S, "silence_s": SILENCE_S},
    )
    actor = raw["workers"]["actor"]
    actor["class"] = "tests.workers_for_tests.FaultyPPO"
    actor["replicas"] = 2
    actor["args"].update(fault="stop", fault_replica=1, fault_at_step=2, marker=str(tmp_path / "hang"))

    result = mf.run(spec_from_dict(raw))
    hung_at = float((tmp_path / "hang").read_text())

    (failure,) = result.failures
    assert failure["iteration"] == 1 and failure["replaced"] is None  # recovered by a restart
    assert SILENCE_S - 1 <= failure["detected_at"] - hung_at < FLOOR_S
    error = failure["error"]
    assert "no beat from actor[1] for 3." in error, error
    assert "process group of 'actor': 1 of 2 ranks in a collective" in error
    collective = r"arrived: actor\[0\] in \w+ \(distributed/[\w.]+\.py:\d+\), called from \w+ \([\w/.]+\.py:\d+\)"
    assert re.search(collective, error), error
    assert "not arrived: actor[1] no answer within 2s: stopped, or hung outside Python" in error
    assert [h["iteration"] for h in result.history] == list(range(ITERATIONS))
