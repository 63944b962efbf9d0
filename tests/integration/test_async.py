"""Asynchronous flows on Ray: training beside the next loop, staleness recorded per sample and bounded,
k = 0 equal to the synchronous flow, checkpoints that hold no pending batch."""

from __future__ import annotations

import pytest
import torch

import m2flow as mf
from m2flow.config import spec_from_dict
from tests.integration.test_training import final_state
from tests.workflows import pendulum_ppo

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_cluster")]


def pendulum(tmp_path, name: str, k: int | None, **run) -> mf.WorkflowSpec:
    raw = pendulum_ppo(
        tmp_path, name, hidden=[16, 16], horizon=32, actor={"num_minibatches": 4}, run={"seed": 4, **run}
    )
    if k is not None:
        raw["flow"]["async"] = {"max_staleness": k}
    raw["placement"] = {"replan": False}
    return spec_from_dict(raw)


def assert_same_weights(a, b) -> None:
    for key, value in a["model"].items():
        torch.testing.assert_close(b["model"][key], value, rtol=0, atol=0, msg=key)


def test_max_staleness_0_trains_exactly_like_the_synchronous_flow(tmp_path):
    synchronous = mf.run(pendulum(tmp_path, "sync", None, iterations=3))
    overlapped = mf.run(pendulum(tmp_path, "async0", 0, iterations=3))
    assert_same_weights(final_state(synchronous, 2), final_state(overlapped, 2))
    for key in ("actor/loss", "actor/approx_kl", "env_steps"):
        assert [h[key] for h in synchronous.history] == [h[key] for h in overlapped.history], key
    assert [h["actor/staleness_max"] for h in overlapped.history] == [0.0, 0.0, 0.0]


def test_one_step_off_trains_each_batch_one_version_late_and_a_resumed_run_starts_a_fresh_segment(tmp_path):
    whole = mf.run(pendulum(tmp_path, "k1", 1, iterations=6, checkpoint_every=3))
    history = whole.history
    # each consumed sample's recorded policy version, against the trainer's: fresh after each checkpoint
    assert [h["actor/staleness_max"] for h in history] == [0.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    assert [h["actor/staleness_mean"] for h in history] == [0.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    assert [h["async/collected_at"] for h in history] == [0.0, 0.0, 1.0, 3.0, 3.0, 4.0]
    assert all("actor/behavior_weight_mean" in h for h in history if h["actor/staleness_max"] > 0)
    # every batch trained once, whole: one loop's steps per iteration, none lost at the checkpoints
    steps = 32 * 4
    assert [h["accounting/steps_produced"] for h in history] == [float(steps)] * 6
    assert [h["env_steps"] for h in history] == [2 * steps, 3 * steps, 3 * steps, 5 * steps, 6 * steps, 6 * steps]

    # a checkpoint holds no pending batch: the resumed run fills its queue again, as the whole run did
    mf.run(pendulum(tmp_path, "k1-resumed", 1, iterations=3, checkpoint_every=3))
    resumed = mf.run(pendulum(tmp_path, "k1-resumed", 1, iterations=6, checkpoint_every=3, resume=True))
    assert [h["iteration"] for h in resumed.history] == [3, 4, 5]
    assert [h["actor/staleness_max"] for h in resumed.history] == [0.0, 1.0, 1.0]
    assert [h["async/collected_at"] for h in resumed.history] == [3.0, 3.0, 4.0]
    assert [h["env_steps"] for h in resumed.history] == [5 * steps, 6 * steps, 6 * steps]
