"""Hugging Face VLM policies (`model: hf`) on tiny random models the tests write themselves (no hub):
loading, inference and training agreeing, a PPO update moving action-token log-probs the advantage's way,
LoRA syncing only adapters, export and reload, FSDP2 sharding and memory estimates. Folders that cannot be used:
`test_hf_folders.py`."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from m2flow.context import WorkerContext, set_context
from m2flow.workers.actor import PPO
from m2flow.workers.models.activations import activation_bytes
from m2flow.workers.models.hf_tiny import make_tiny_vlm
from m2flow.workers.rollout import TorchPolicy
from tests.autograd_memory import saved_for_backward

VIEW = {"cameras": ["track"], "modalities": ["rgb"], "size": (32, 32)}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm") / "model")


def policy_args(folder, **hf) -> dict:
    return {"env_id": "HalfCheetah-v5", "model": "hf", "observation": VIEW, "hf": {"path": str(folder), **hf}}


def pair(folder, **hf) -> tuple[PPO, TorchPolicy]:
    set_context(WorkerContext(worker="actor", kind="training", seed=1, iterations=1))
    actor = PPO(**policy_args(folder, **hf), num_minibatches=1, update_epochs=4, normalize_reward=False, norm_adv=False)
    set_context(WorkerContext(worker="rollout", kind="inference", seed=1))
    rollout = TorchPolicy(**policy_args(folder, **hf))
    rollout.load_weights(actor.weights())
    return actor, rollout


def observation(n: int = 4, seed: int = 0) -> dict[str, np.ndarray]:
    rgb = np.random.default_rng(seed).integers(0, 255, (n, 1, 32, 32, 3), dtype=np.uint8)
    return {"rgb": rgb, "env_id": np.arange(n)}


@pytest.mark.parametrize("head", ["gaussian", "tokens"])
def test_inference_and_training_give_the_same_log_probs(folder, head):
    actor, rollout = pair(folder, head=head, action_bins=32)
    obs = observation()
    out = rollout.act(obs)
    assert out["action"].shape == (4, 6) and np.isfinite(out["logprob"]).all()
    with torch.no_grad():
        _, logprob, _, value = actor.model.get_action_and_value(
            actor.model.inputs(obs, actor.device), torch.tensor(out["action"])
        )
    np.testing.assert_allclose(logprob.numpy(), out["logprob"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(value.numpy(), out["value"], rtol=1e-5, atol=1e-5)


def test_a_grpo_update_moves_action_token_log_probs_the_advantages_way(folder):
    set_context(WorkerContext(worker="actor", kind="training", seed=1, iterations=1))
    hf = {"head": "tokens", "action_bins": 32}
    actor = PPO(
        **policy_args(folder, **hf),
        advantage="grpo",
        group_size=4,
        num_minibatches=1,
        update_epochs=4,
        normalize_reward=False,
        learning_rate=1e-3,
    )
    set_context(WorkerContext(worker="rollout", kind="inference", seed=1))
    rollout = TorchPolicy(**policy_args(folder, **hf))
    rollout.load_weights(actor.weights())
    obs = observation()
    out = rollout.act(obs)
    reward = np.array([[3.0, 1.0, -1.0, -3.0]], np.float32)  # env 0's action good, env 3's bad
    trajectory = {
        "obs": {"rgb": obs["rgb"][None]},
        "action": out["action"][None],
        "logprob": out["logprob"][None],
        "value": out["value"][None],
        "reward": reward,
        "done": np.zeros((1, 4), np.float32),
        "next_obs": {"rgb": obs["rgb"]},
        "next_done": np.zeros(4, np.float32),
        "env_ids": np.arange(4),
    }
    actor.train([trajectory])
    with torch.no_grad():
        _, after, _, _ = actor.model.get_action_and_value(
            actor.model.inputs(obs, actor.device), torch.tensor(out["action"])
        )
    change = after.numpy() - out["logprob"]
    assert change[0] > 0 > change[3], change


def test_the_tokens_head_reads_the_bins_of_a_full_forward_at_the_action_positions(folder):
    actor, _ = pair(folder, head="tokens", action_bins=32)
    model = actor.model
    obs = model.inputs(observation(), actor.device)
    with torch.no_grad():
        ids, pixels = model.prompt_inputs(obs, extra=model.act_dim)
        full = model.backbone(input_ids=ids, pixel_values=pixels).logits  # every position, every token
        torch.testing.assert_close(
            model.bin_logits(model._decode(obs, extra=model.act_dim)), full[:, -model.act_dim :, model.bin_tokens :]
        )


def test_lora_trains_and_syncs_only_the_adapters_and_heads(folder):
    actor, rollout = pair(folder, lora={"r": 4})
    with torch.no_grad():  # "trained": without it the adapters' zero init would make the sync unobservable
        for p in actor.model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    update = actor.weights()
    assert update["scope"] == "trainable"
    keys = set(update["state"])
    assert keys and all("lora_" in k or not k.startswith("backbone.") for k in keys)
    total = len(actor.model.state_dict())
    assert len(keys) < total / 2
    rollout.load_weights(update)
    obs = observation()
    with torch.no_grad():
        a = actor.model.mean_action(actor.model.inputs(obs, actor.device))
        b = rollout.model.mean_action(rollout.model.inputs(obs, rollout.device))
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize("hf", [{"head": "gaussian"}, {"head": "tokens", "action_bins": 32, "lora": {"r": 4}}])
def test_an_export_loads_again_and_acts_the_same(folder, tmp_path, hf):
    actor, _ = pair(folder, **hf)
    with torch.no_grad():
        for p in actor.model.parameters():
            if p.requires_grad:
                p.add_(0.01 * torch.randn_like(p))  # "trained"
    actor.export(str(tmp_path / "exported"))
    assert json.loads((tmp_path / "exported" / "m2flow_policy.json").read_text())["head"] == hf["head"]
    set_context(WorkerContext(worker="rollout", kind="inference", seed=1))
    reloaded = TorchPolicy(**policy_args(tmp_path / "exported", **{k: v for k, v in hf.items() if k != "lora"}))
    obs = observation()
    with torch.no_grad():
        a = actor.model.mean_action(actor.model.inputs(obs, actor.device))
        b = reloaded.model.mean_action(reloaded.model.inputs(obs, reloaded.device))
    torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)


def test_the_memory_estimate_comes_from_the_config_alone(folder):
    config = TorchPolicy.Config(**policy_args(folder))
    estimate = TorchPolicy.memory_estimate_gb(config, 64) * 2**30
    set_context(WorkerContext(worker="rollout", kind="inference"))
    built = TorchPolicy(**policy_args(folder)).model.state_dict()
    assert estimate == pytest.approx(sum(t.numel() * t.element_size() for t in built.values()), rel=0.01)


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("hf", [{"head": "gaussian"}, {"head": "tokens", "action_bins": 32}])
def test_the_activation_estimate_is_within_15_percent_of_what_a_vlm_forward_keeps(folder, hf, bf16):
    args = PPO.Config(**policy_args(folder, instruction="run forward", **hf))
    set_context(WorkerContext(worker="actor", kind="training", seed=1, iterations=1))
    model = args.build().train()
    n = 32
    obs = {"rgb": torch.tensor(observation(n)["rgb"])}
    estimate = activation_bytes(args.stacks(), n, checkpointing=False, bf16=bf16)
    assert estimate == pytest.approx(saved_for_backward(model, obs, bf16), rel=0.15)


def test_the_decoder_token_count_of_the_estimate_is_the_prompt_the_policy_builds(folder):
    args = PPO.Config(**policy_args(folder, instruction="open the red drawer"))
    set_context(WorkerContext(worker="actor", kind="training", seed=1, iterations=1))
    assert args.stacks()[1].tokens == args.build().template.shape[1]


def trajectory(n: int = 8, act_dim: int = 6) -> dict:
    rng = np.random.default_rng(0)
    rgb = observation(n)["rgb"]
    return {
        "obs": {"rgb": rgb[None]},
        "action": rng.uniform(-1, 1, (1, n, act_dim)).astype(np.float32),
        "logprob": np.zeros((1, n), np.float32),
        "value": np.zeros((1, n), np.float32),
        "reward": rng.normal(size=(1, n)).astype(np.float32),
        "done": np.zeros((1, n), np.float32),
        "next_obs": {"rgb": rgb},
        "next_done": np.zeros(n, np.float32),
        "env_ids": np.arange(n),
    }


def test_activation_checkpointing_keeps_less_for_backward_and_trains_the_same(folder):
    runs = {}
    for checkpointing in (False, True):
        set_context(WorkerContext(worker="actor", kind="training", seed=1, iterations=1))
        actor = PPO(
            **policy_args(folder),
            num_minibatches=1,
            update_epochs=1,
            normalize_reward=False,
            activation_checkpointing=checkpointing,
        )
        obs = {"rgb": torch.tensor(observation(8)["rgb"])}
        saved = saved_for_backward(actor.model, obs)
        actor.model.zero_grad()
        runs[checkpointing] = (saved, actor.train([trajectory()])["actor/loss"])
    assert runs[True][0] < runs[False][0] / 2
    assert runs[True][1] == pytest.approx(runs[False][1], rel=1e-5)


def test_an_action_chunk_policy_acts_and_trains_on_chunk_x_action_size(folder):
    set_context(WorkerContext(worker="actor", kind="training", seed=1, iterations=1))
    chunked = {**policy_args(folder, head="tokens", action_bins=32), "chunk": 4}
    actor = PPO(**chunked, num_minibatches=1, update_epochs=1, normalize_reward=False)
    set_context(WorkerContext(worker="rollout", kind="inference", seed=1))
    rollout = TorchPolicy(**chunked)
    rollout.load_weights(actor.weights())
    out = rollout.act(observation())
    assert out["action"].shape == (4, 24)  # 4 actions of HalfCheetah's 6 per call
    assert np.isfinite(actor.train([trajectory(act_dim=24)])["actor/loss"])


def _fsdp_rank(rank: int, port: int, folder: str, dtype: str, results) -> None:
    """One rank of a two-rank FSDP2 group (gloo) training the tiny VLM policy on its share of a batch."""
    import os

    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    set_context(WorkerContext(worker="actor", kind="training", replica=rank, replicas=2, seed=1, iterations=1))
    actor = PPO(**policy_args(folder, dtype=dtype), num_minibatches=2, update_epochs=1, normalize_reward=False)
    sharded = [block for block in actor.model.blocks if isinstance(block, FSDPModule)]
    obs = observation(4, seed=rank)
    rng = np.random.default_rng(rank)
    trajectory = {
        "obs": {"rgb": obs["rgb"][None]},
        "action": rng.normal(size=(1, 4, 6)).astype(np.float32),
        "logprob": np.zeros((1, 4), np.float32),
        "value": np.zeros((1, 4), np.float32),
        "reward": rng.normal(size=(1, 4)).astype(np.float32),
        "done": np.zeros((1, 4), np.float32),
        "next_obs": {"rgb": obs["rgb"]},
        "next_done": np.zeros(4, np.float32),
        "env_ids": np.arange(4) + 4 * rank,
    }
    metrics = actor.train([trajectory])
    state = actor.weights()["state"]
    results.put(
        {
            "rank": rank,
            "sharded": len(sharded),
            "blocks": len(actor.model.blocks),
            "dtypes": {str(p.dtype) for p in actor.model.parameters()},
            "steps": metrics["actor/steps_consumed"],
            "checksum": sum(float(v.double().sum()) for v in state.values()),
            "loss": metrics["actor/loss"],
        }
    )
    dist.destroy_process_group()


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_fsdp2_shards_every_vision_and_decoder_layer_and_the_ranks_agree(folder, dtype):
    """bf16: the backbone loaded in bf16 under fp32 heads is sharded as fp32 master weights, as on one rank
    (what trains keeps fp32 masters; FSDP2 shards groups of one dtype)."""
    import torch.multiprocessing as mp

    from m2flow.runtime.distributed import free_port

    results = mp.get_context("spawn").Queue()
    mp.spawn(_fsdp_rank, args=(free_port(), str(folder), dtype, results), nprocs=2)
    ranks = sorted((results.get(timeout=60) for _ in range(2)), key=lambda r: r["rank"])
    assert all(r["sharded"] == r["blocks"] == 4 for r in ranks)  # 2 vision + 2 decoder layers, each sharded
    assert all(r["dtypes"] == {"torch.float32"} and np.isfinite(r["loss"]) for r in ranks)
    assert all(r["steps"] == 8 for r in ranks)  # each rank trained on its 4 envs; the group on all 8
    assert ranks[0]["checksum"] == pytest.approx(ranks[1]["checksum"], rel=1e-9)  # one model after the update


def test_the_training_estimate_counts_gradients_and_adam_only_for_what_lora_trains(folder):
    full = PPO.memory_estimate_gb(PPO.Config(**policy_args(folder)), 64)
    adapters = PPO.memory_estimate_gb(PPO.Config(**policy_args(folder, lora={"r": 4})), 64)
    assert adapters < 0.5 * full


def test_a_model_loaded_in_bf16_trains_fp32_master_weights_on_one_rank_as_on_several(folder):
    set_context(WorkerContext(worker="actor", kind="training", seed=1, iterations=1))
    full = PPO(**policy_args(folder, dtype="bf16"), num_minibatches=1, update_epochs=1, normalize_reward=False)
    assert {p.dtype for p in full.model.parameters()} == {torch.float32}
    set_context(WorkerContext(worker="actor", kind="training", seed=1, iterations=1))
    adapters = PPO(**policy_args(folder, dtype="bf16", lora={"r": 4}), num_minibatches=1, normalize_reward=False)
    trained = {p.dtype for p in adapters.model.parameters() if p.requires_grad}
    frozen = {p.dtype for p in adapters.model.parameters() if not p.requires_grad}
    assert trained == {torch.float32} and frozen == {torch.bfloat16}  # the frozen base stays as loaded
    assert np.isfinite(adapters.train([trajectory()])["actor/loss"])
    # the planner counts what trains as fp32 masters, however it loaded; a frozen base as loaded
    as_fp32 = PPO.memory_estimate_gb(PPO.Config(**policy_args(folder)), 64)
    assert PPO.memory_estimate_gb(PPO.Config(**policy_args(folder, dtype="bf16")), 64) == pytest.approx(as_fp32)
    lora_fp32 = PPO.memory_estimate_gb(PPO.Config(**policy_args(folder, lora={"r": 4})), 64)
    assert PPO.memory_estimate_gb(PPO.Config(**policy_args(folder, dtype="bf16", lora={"r": 4})), 64) < lora_fp32


def test_a_checkpoint_with_dropout_acts_and_trains_as_one_function(folder, tmp_path):
    dropping = tmp_path / "dropout"
    shutil.copytree(folder, dropping)
    config = json.loads((dropping / "config.json").read_text())
    config["text_config"]["attention_dropout"] = config["vision_config"]["attention_dropout"] = 0.5
    (dropping / "config.json").write_text(json.dumps(config))
    actor, rollout = pair(dropping)
    obs = observation()
    out = rollout.act(obs)  # eval mode
    with torch.no_grad():  # the training worker's model is in train mode
        _, logprob, _, _ = actor.model.get_action_and_value(
            actor.model.inputs(obs, actor.device), torch.tensor(out["action"])
        )
    np.testing.assert_allclose(logprob.numpy(), out["logprob"], rtol=1e-5, atol=1e-5)


def test_a_lora_checkpoint_holds_only_the_adapters_and_heads_and_resumes_them(folder, tmp_path):
    from m2flow.workers.actor import read_checkpoint

    actor, _ = pair(folder, lora={"r": 4})
    actor.train([trajectory()])
    actor.save_checkpoint(str(tmp_path / "ckpt"))
    saved = read_checkpoint(tmp_path / "ckpt")["model"]
    assert saved.keys() == actor.model.trainable_keys()  # no base weight: those come from the folder
    resumed, _ = pair(folder, lora={"r": 4})
    resumed.load_checkpoint(str(tmp_path / "ckpt"))
    for key, value in resumed.model.state_dict().items():
        torch.testing.assert_close(value, actor.model.state_dict()[key], msg=key)


@pytest.mark.parametrize(
    "hf",
    [
        {"head": "gaussian"},
        {"head": "tokens", "action_bins": 32, "dtype": "bf16"},
        {"head": "gaussian", "dtype": "bf16", "lora": {"r": 4}},
        {"head": "tokens", "action_bins": 32, "lora": {"r": 2, "target_modules": ["q_proj", "k_proj", "up_proj"]}},
    ],
)
def test_the_state_counted_from_the_folder_s_files_equals_the_model_built_on_the_meta_device(folder, hf):
    from m2flow.workers.models import PolicyArgs
    from m2flow.workers.models.hf_folder import folder_size
    from m2flow.workers.models.policy_args import camera_inputs

    args = PolicyArgs(**policy_args(folder, **hf))
    with torch.device("meta"):
        model = args.build()
    trainable = [p for p in model.parameters() if p.requires_grad]
    built = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    counted = folder_size(args.hf, camera_inputs(args))
    assert counted.trainable == sum(p.numel() for p in trainable)
    assert counted.trainable_bytes == sum(p.numel() * p.element_size() for p in trainable)
    # the backbone's buffers that its checkpoint does not hold (rotary frequencies, position ids) are left out
    assert counted.bytes == pytest.approx(built, rel=2e-3)


@pytest.mark.parametrize("head", ["gaussian", "tokens"])
def test_the_layer_stacks_read_from_the_folder_s_files_equal_those_transformers_gives(folder, head, monkeypatch):
    from m2flow.workers.models import hf_folder
    from m2flow.workers.models.hf_options import HFOptions

    options = HFOptions(path=str(folder), head=head, action_bins=32, instruction="pick the red cube")
    read = hf_folder.hf_stacks(options, act_dim=6)
    monkeypatch.setattr(hf_folder, "_read_prompt", lambda options: None)  # through transformers instead
    assert read == hf_folder.hf_stacks(options, act_dim=6)
