"""Training through the executor: two FSDP2 ranks equal one, resume continues, PPO learns."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

import m2flow as mf
from m2flow.config import spec_from_dict
from m2flow.errors import CheckpointError
from m2flow.runtime.checkpoint import latest_checkpoint, read_meta
from m2flow.workers.actor import read_checkpoint
from tests.workflows import pendulum_ppo

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_cluster")]

PPO_ARGS = {"env_id": "HalfCheetah-v5", "hidden": [32, 32], "num_minibatches": 4, "update_epochs": 2}


def fixed_batch_workflow(tmp_path, ranks: int, name: str, backend: str = "fsdp") -> mf.WorkflowSpec:
    return spec_from_dict(
        {
            "name": name,
            "workers": {
                # one shard per data-parallel rank (tensor-parallel ranks share one)
                "data": {
                    "kind": "function",
                    "class": "tests.workers_for_tests.FixedBatch",
                    "replicas": ranks if backend == "fsdp" else 1,
                },
                "actor": {
                    "kind": "training",
                    "class": "m2flow.workers.actor.PPO",
                    "backend": backend,
                    "replicas": ranks,
                    "args": PPO_ARGS,
                },
            },
            "flow": {"then": ["data.trajectory -> actor.train"]},
            "placement": {"mode": "shared"},
            "run": {"iterations": 2, "output_dir": str(tmp_path), "progress": False, "seed": 3},
        }
    )


def final_state(result, iteration: int = 1) -> dict:
    checkpoint = latest_checkpoint(result.run_dir / "checkpoints")
    assert read_meta(checkpoint)["iteration"] == iteration
    return read_checkpoint(checkpoint / "actor")


def test_two_fsdp_ranks_train_like_one(tmp_path):
    one = mf.run(fixed_batch_workflow(tmp_path, 1, "fsdp1"))
    two = mf.run(fixed_batch_workflow(tmp_path, 2, "fsdp2"))
    a, b = final_state(one), final_state(two)
    assert a["model"].keys() == b["model"].keys()
    moved = False
    for key in a["model"]:
        torch.testing.assert_close(a["model"][key], b["model"][key], rtol=1e-4, atol=1e-5, msg=key)
        moved |= bool(a["model"][key].abs().sum() > 0)
    assert moved
    for key in ("actor/loss", "actor/approx_kl", "actor/grad_norm"):
        assert one.last[key] == pytest.approx(two.last[key], rel=1e-4, abs=1e-6), key


def test_megatron_tensor_parallel_trains_like_one_rank(tmp_path):
    one = mf.run(fixed_batch_workflow(tmp_path, 1, "tp1", backend="fsdp"))
    two = mf.run(fixed_batch_workflow(tmp_path, 2, "tp2", backend="megatron"))
    a, b = final_state(one), final_state(two)
    assert a["model"].keys() == b["model"].keys()  # the shards were gathered back into the plain layout
    for key in a["model"]:
        torch.testing.assert_close(a["model"][key], b["model"][key], rtol=1e-4, atol=1e-5, msg=key)
    for key in ("actor/loss", "actor/approx_kl", "actor/grad_norm"):
        assert one.last[key] == pytest.approx(two.last[key], rel=1e-4, abs=1e-6), key


@pytest.mark.parametrize("backend", ["fsdp", "megatron"])
def test_a_checkpoint_of_two_ranks_resumes_on_one_and_trains_on_alike(tmp_path, backend):
    """Sharded checkpoints (torch.distributed.checkpoint) reload at another world size, and a Megatron
    TP=2 checkpoint under FSDP: 2 iterations on two ranks + 2 resumed on one = 4 on one."""

    def workflow(name: str, ranks: int, backend: str, iterations: int, resume: bool = False) -> mf.WorkflowSpec:
        raw = fixed_batch_workflow(tmp_path, ranks, name, backend=backend).to_dict()
        raw["run"].update(iterations=iterations, checkpoint_every=1, resume=resume)
        # a constant learning rate: an annealed one follows each run's own length (2 planned, then 4)
        raw["workers"]["actor"]["args"]["anneal_lr"] = False
        return spec_from_dict(raw)

    mf.run(workflow(f"reshard-{backend}", 2, backend, iterations=2))
    resumed = mf.run(workflow(f"reshard-{backend}", 1, "fsdp", iterations=4, resume=True))
    assert [h["iteration"] for h in resumed.history] == [2, 3]
    reference = mf.run(workflow("four", 1, "fsdp", iterations=4))
    a, b = final_state(reference, 3), final_state(resumed, 3)
    for part in ("model", "optimizer"):
        theirs = _tensors(b[part])
        for key, value in _tensors(a[part]).items():
            torch.testing.assert_close(theirs[key], value, rtol=1e-4, atol=1e-5, msg=key)
    assert a["progress"]["version"] == b["progress"]["version"] == 4


def _tensors(tree, prefix: str = "") -> dict[str, torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return {prefix: tree}
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in _tensors(sub, f"{prefix}.{key}").items()}
    return {}


def test_resume_continues_from_the_last_checkpoint_and_logs_each_iteration_once(tmp_path):
    spec = fixed_batch_workflow(tmp_path, 1, "resume")
    raw = spec.to_dict()
    raw["run"].update(checkpoint_every=1, iterations=3)
    first = mf.run(spec_from_dict(raw))
    assert [h["iteration"] for h in first.history] == [0, 1, 2]
    shutil.rmtree(latest_checkpoint(first.run_dir / "checkpoints"))  # killed before iteration 2's was written
    raw["run"].update(iterations=4, resume=True)
    second = mf.run(spec_from_dict(raw))
    assert [h["iteration"] for h in second.history] == [2, 3]
    assert second.last["actor/weights_version"] == 4.0  # two updates before the stop, two after
    lines = [json.loads(line) for line in (second.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["iteration"] for line in lines] == [0, 1, 2, 3]  # iteration 2 done again, logged once (TensorBoard:
    # tests/unit/test_reporting.py; this workflow steps no env, so its scalars all sit at step 0)


def test_a_resume_whose_checkpoint_does_not_fit_names_the_changed_setting_and_keeps_the_run_s_record_and_logs(tmp_path):
    spec = fixed_batch_workflow(tmp_path, 1, "changed")
    raw = spec.to_dict()
    raw["run"].update(checkpoint_every=1, iterations=1)
    first = mf.run(spec_from_dict(raw))
    kept = ("workflow.yaml", "plan.json", "trace.json", "processes.json", "metrics.jsonl")
    record = {name: (first.run_dir / name).read_bytes() for name in kept}
    raw["run"].update(iterations=2, resume=True)
    raw["workers"]["actor"]["args"]["hidden"] = [16, 16]
    with pytest.raises(CheckpointError) as caught:
        mf.run(spec_from_dict(raw))
    said = " ".join(str(caught.value).split())
    assert f"run.resume: {latest_checkpoint(first.run_dir / 'checkpoints')} did not load" in said
    assert "workers.actor.args.hidden: [32, 32] there, [16, 16] here" in said
    assert {name: (first.run_dir / name).read_bytes() for name in record} == record  # eval still reads the run


def test_a_streamed_batch_trains_exactly_like_a_whole_one(tmp_path):
    """Each simulator replica's trajectory goes to PPO.train_part as its loop ends; the update equals
    the one of a PPO that waits for the whole batch."""

    def spec(name: str, actor_class: str) -> mf.WorkflowSpec:
        raw = pendulum_ppo(
            tmp_path, name, hidden=[16, 16], horizon=32, actor={"num_minibatches": 4}, run={"iterations": 2, "seed": 4}
        )
        raw["workers"]["env"]["replicas"] = 2
        raw["workers"]["actor"]["class"] = actor_class
        raw["placement"] = {"mode": "hybrid", "pipeline_stages": 2}
        return spec_from_dict(raw)

    streamed = mf.run(spec("streamed", "m2flow.workers.actor.PPO"))
    whole = mf.run(spec("whole", "tests.workers_for_tests.WholeBatchPPO"))
    then = next(p for p in streamed.plan.phases if p.op == "then")
    assert [str(e) for e in then.streamed] == ["env.trajectory -> actor.train"]
    assert [h["actor/parts_streamed"] for h in streamed.history] == [4.0, 4.0]  # 2 replicas x 2 slices
    assert [h["actor/parts_streamed"] for h in whole.history] == [0.0, 0.0]
    a, b = final_state(streamed), final_state(whole)
    for key, value in a["model"].items():
        torch.testing.assert_close(b["model"][key], value, rtol=0, atol=0, msg=key)
    for key in ("actor/loss", "actor/approx_kl"):
        assert streamed.last[key] == whole.last[key], key


def test_ppo_learns_inverted_pendulum(tmp_path):
    raw = pendulum_ppo(
        tmp_path,
        "ppo-pendulum",
        num_envs=8,
        horizon=128,
        actor={"num_minibatches": 8, "update_epochs": 10},
        run={"iterations": 30, "seed": 1, "checkpoint_every": 0},
    )
    # the pendulum's observations are already of unit scale; per-env running normalisation (the default,
    # as CleanRL) slows its first 30k steps: 118 vs 1000 at iteration 30 with this seed
    raw["workers"]["env"]["args"]["normalize_obs"] = False
    spec = spec_from_dict(raw)
    result = mf.run(spec)
    returns = [h["env/episode_return"] for h in result.history if "env/episode_return" in h]
    assert returns[0] < 30, "an untrained policy balances only briefly"
    assert max(returns[-5:]) > 200, f"PPO should balance the pendulum within 30k steps, got {returns}"
    assert result.last["env_steps"] == 30 * 128 * 8
