"""Asynchronous flows on Ray: training beside the next loop, staleness recorded per sample and bounded,
k = 0 equal to the synchronous flow, checkpoints that hold no pending batch."""

from __future__ import annotations

import pytest
import torch

import m2flow as mf
from m2flow.config import spec_from_dict
from m2flow.graph import build_graph
from m2flow.planners import device_kinds, make_plan, profile_of
from m2flow.planners.cache import load_cached
from tests.conftest import ROOT
from tests.integration.test_loop import counter_workflow
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
    # training beside the loop: a device's overlapping work counts once, so none is busy past its wall time
    assert whole.device_busy and all(0.0 < share <= 1.0 for share in whole.device_busy.values()), whole.device_busy

    # a checkpoint holds no pending batch: the resumed run fills its queue again, as the whole run did
    mf.run(pendulum(tmp_path, "k1-resumed", 1, iterations=3, checkpoint_every=3))
    resumed = mf.run(pendulum(tmp_path, "k1-resumed", 1, iterations=6, checkpoint_every=3, resume=True))
    assert [h["iteration"] for h in resumed.history] == [3, 4, 5]
    assert [h["actor/staleness_max"] for h in resumed.history] == [0.0, 1.0, 1.0]
    assert [h["async/collected_at"] for h in resumed.history] == [3.0, 3.0, 4.0]
    assert [h["env_steps"] for h in resumed.history] == [5 * steps, 6 * steps, 6 * steps]


def test_drop_mode_never_waits_for_a_slow_learner_and_accounts_every_step_trained_or_dropped(tmp_path):
    raw = counter_workflow(tmp_path, iterations=8, checkpoint_every=4).to_dict()
    raw["workers"]["learner"].update({"class": "tests.workers_for_tests.SlowCollect", "args": {"seconds": 2.0}})
    raw["flow"]["async"] = {"max_staleness": 1, "on_stale": "drop"}
    raw["placement"] = {"replan": False}  # asynchronous from the first iteration (no synchronous calibration)
    history = mf.run(spec_from_dict(raw)).history
    one_loop = 2 * 3 * 5
    assert [h["env_steps"] for h in history] == [one_loop * (i + 1) for i in range(8)]  # a loop every iteration
    # the training issued in iteration 1 (on batch 0) takes 2 s, far longer than a loop of a few ms: iterations
    # 1 and 2 ran their loops beside it and finished no training; only a segment's last iteration waits for it
    assert [i for i, h in enumerate(history) if "async/trained_batches" in h] == [3, 7]
    assert [i for i, h in enumerate(history) if "time/train_wait_s" in h] == [3, 7]
    trained = [h for h in history if "async/staleness" in h]
    assert trained and all(h["async/staleness"] <= 1 and h["envs"] == 6 for h in trained)
    dropped = sum(h.get("async/dropped_steps", 0.0) for h in history)
    assert dropped > 0
    assert sum(h["async/trained_batches"] for h in trained) * one_loop + dropped == 8 * one_loop


def async_ppo_config(tmp_path, *overrides: str) -> mf.WorkflowSpec:
    """configs/ppo_async_mujoco.yaml shrunk to InvertedPendulum."""
    policy = ["env.args.evaluation.policy", "rollout.args", "actor.args"]
    return mf.load_spec(
        ROOT / "configs" / "ppo_async_mujoco.yaml",
        [
            *[f"workers.{key}.env_id=InvertedPendulum-v5" for key in ["env.args", *policy]],
            *[f"workers.{key}.hidden=[16, 16]" for key in policy],
            "flow.loop.horizon=32",
            "flow.sync.1.every=100",  # evaluated before the first iteration only
            "workers.env.args.evaluation.episodes=2",
            f"run.output_dir={tmp_path}",
            "run.progress=false",
            *overrides,
        ],
    )


def test_drop_mode_trains_ppo_within_the_bound_by_each_sample_s_recorded_policy_version(tmp_path):
    spec = async_ppo_config(
        tmp_path, "flow.async.on_stale=drop", "run.iterations=5", "run.checkpoint_every=5", "placement.replan=false"
    )  # asynchronous from the first iteration (no synchronous calibration)
    history = mf.run(spec).history
    trained = [h for h in history if "actor/staleness_max" in h]
    assert trained and all(h["actor/staleness_max"] <= 1 for h in trained)
    # the controller's count of versions behind and the versions the samples carry agree
    assert all(h["actor/staleness_max"] == h["async/staleness"] for h in trained)
    one_loop, dropped = history[0]["env_steps"], sum(h.get("async/dropped_steps", 0.0) for h in history)
    assert sum(h["async/trained_batches"] for h in trained) * one_loop + dropped == history[-1]["env_steps"]


def test_an_asynchronous_flow_with_unknown_costs_measures_them_synchronously_then_runs_asynchronously(tmp_path, capsys):
    raw = pendulum_ppo(tmp_path, "calibrated", hidden=[16, 16], horizon=32, run={"seed": 4, "iterations": 6})
    raw["flow"]["async"] = {"max_staleness": 1}
    spec = spec_from_dict(raw)
    result = mf.run(spec)
    history = result.history
    # three synchronous iterations measure the costs (each batch trained at once), then a fresh asynchronous
    # segment: its first iteration fills the queue, the next ones train one version late
    assert [h["actor/staleness_max"] for h in history] == [0.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    assert [h["async/collected_at"] for h in history[3:]] == [3.0, 3.0, 4.0]
    assert "async/collected_at" not in history[2]
    steps = 32 * 4
    assert [h["accounting/steps_produced"] for h in history] == [float(steps)] * 6
    said = " ".join(capsys.readouterr().err.split())  # the console wraps lines
    assert "then re-planning; they run synchronously (training beside the loop would skew them)" in said
    assert "replan: keeping" in said or "replan: switching" in said
    assert "replan: " in result.plan.notes[-1]
    # the plan that ran is the asynchronous one, predicted from the measured costs, and those are cached
    assert result.plan.predicted.unknown_costs == []
    assert any(p.overlaps for p in result.plan.phases)
    graph = build_graph(spec)
    cluster = result.plan.cluster
    cached = load_cached(graph, device_kinds(graph, cluster))
    assert {"env.step", "rollout.act", "actor.train"} <= set(cached)
    assert make_plan(graph, cluster, profile_of(graph, cluster)).predicted.unknown_costs == []
