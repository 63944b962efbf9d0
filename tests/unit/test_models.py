"""The vision-transformer policy family: sizes from ~1M to ~300M parameters (sized on the meta device);
activation checkpointing changes nothing but cost; bf16 computes in bf16 and keeps fp32 master weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from m2flow.context import WorkerContext
from m2flow.workers.actor import PPO, BackendOptions, get_backend
from m2flow.workers.models import PolicyArgs, state_bytes
from m2flow.workers.models.activations import activation_bytes
from tests.autograd_memory import saved_for_backward

VIEW = {"cameras": ["track"], "modalities": ["rgb", "proprio"], "size": (32, 32)}


def vit_args(**changes) -> PolicyArgs:
    return PolicyArgs(env_id="HalfCheetah-v5", model="vit", observation=VIEW, **changes)


@pytest.mark.parametrize(("size", "low", "high"), [("1m", 0.7e6, 1.5e6), ("10m", 9e6, 12e6), ("300m", 280e6, 330e6)])
def test_presets_are_named_by_their_parameter_count(size, low, high):
    params = state_bytes(vit_args(size=size)) / 4  # fp32
    assert low < params < high


def test_width_depth_heads_override_the_preset():
    small, deeper = vit_args(size="1m"), vit_args(size="1m", depth=8)
    assert state_bytes(deeper) > 1.8 * state_bytes(small)
    assert deeper.blocks() == 8
    with pytest.raises(ValueError, match="multiple of heads"):
        vit_args(width=100, heads=3).build()


def test_memory_estimate_shrinks_with_cpu_offload():
    args = {"env_id": "HalfCheetah-v5", "model": "vit", "observation": VIEW, "size": "10m"}
    on_device = PPO.memory_estimate_gb(PPO.Config(**args), 64)
    offloaded = PPO.memory_estimate_gb(PPO.Config(**args, cpu_offload=True), 64)
    assert offloaded < on_device / 10  # the state leaves (~one block of six stays), the activations do not


@pytest.mark.parametrize("bf16", [False, True])
def test_the_activation_estimate_is_within_15_percent_of_what_a_vit_forward_keeps(bf16):
    args = PolicyArgs(env_id="HalfCheetah-v5", model="vit", observation={**VIEW, "size": (64, 64)}, size="1m")
    model = args.build().train()
    n = 32
    rng = np.random.default_rng(0)
    obs = {
        "rgb": torch.tensor(rng.integers(0, 255, (n, 1, 64, 64, 3), dtype=np.uint8)),
        "proprio": torch.randn(n, 17),
    }
    estimate = activation_bytes(args.stacks(), n, checkpointing=False, bf16=bf16)
    assert estimate == pytest.approx(saved_for_backward(model, obs, bf16), rel=0.15)
    # with checkpointing each block keeps its input, and one block's activations live while it recomputes
    assert activation_bytes(args.stacks(), n, checkpointing=True, bf16=bf16) < estimate / 2


def test_the_training_memory_estimate_counts_a_minibatch_of_activations():
    config = PPO.Config(env_id="HalfCheetah-v5", model="vit", observation=VIEW, size="10m", num_minibatches=4)
    weights_only = PPO.memory_estimate_gb(config, 4)
    assert PPO.memory_estimate_gb(config, 4096) > 10 * weights_only  # 1,024 samples' activations per minibatch
    checkpointed = config.model_copy(update={"activation_checkpointing": True})
    assert PPO.memory_estimate_gb(checkpointed, 4096) < PPO.memory_estimate_gb(config, 4096) / 2
    bf16 = config.model_copy(update={"precision": "bf16"})
    assert PPO.memory_estimate_gb(bf16, 4096) < PPO.memory_estimate_gb(config, 4096)


def test_the_memory_advice_names_the_larger_part_and_the_args_key_that_lowers_it():
    config = PPO.Config(env_id="HalfCheetah-v5", model="vit", observation=VIEW, size="10m", num_minibatches=4)
    activations = PPO.memory_advice(config, 4096)  # 1,024 samples' activations outweigh a 10M model's state
    assert activations.startswith("a minibatch of 1024 samples keeps")
    assert "raise args.num_minibatches (now 4) or set args.activation_checkpointing: true" in activations
    checkpointed = PPO.memory_advice(config.model_copy(update={"activation_checkpointing": True}), 2**16)
    assert "raise args.num_minibatches (now 4)" in checkpointed and "activation_checkpointing" not in checkpointed
    sized = PPO.memory_advice(config.model_copy(update={"minibatch_size": 2048}), 4096)
    assert "lower args.minibatch_size (now 2048)" in sized
    state = PPO.memory_advice(config, 4)  # one sample a minibatch: the state is the larger part
    assert state.startswith("the model's state for training takes") and "set args.cpu_offload: true" in state


def observation(n: int = 6) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(0)
    return {
        "rgb": torch.tensor(rng.integers(0, 255, (n, 1, 32, 32, 3), dtype=np.uint8)),
        "proprio": torch.tensor(rng.normal(size=(n, 17)), dtype=torch.float32),
    }


def loss_and_grads(model, obs, options: BackendOptions) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    backend = get_backend(WorkerContext(worker="actor", kind="training"), options)
    return loss_and_grads_of(backend.wrap(model), backend, obs)


def loss_and_grads_of(model, backend, obs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    with backend.compute():
        _, logprob, entropy, value = model.get_action_and_value(obs, torch.zeros(len(obs["proprio"]), 6))
        loss = -(logprob.mean() + 0.01 * entropy.mean()) + value.square().mean()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_activation_checkpointing_recomputes_the_same_gradients():
    obs = observation()
    torch.manual_seed(0)
    plain = vit_args().build()
    torch.manual_seed(0)
    checkpointed = vit_args().build()
    loss_a, grads_a = loss_and_grads(plain, obs, BackendOptions())
    loss_b, grads_b = loss_and_grads(checkpointed, obs, BackendOptions(activation_checkpointing=True))
    assert checkpointed.activation_checkpointing and not plain.activation_checkpointing
    torch.testing.assert_close(loss_a, loss_b)
    for name, grad in grads_a.items():
        torch.testing.assert_close(grads_b[name], grad, msg=name)


def _bf16_rank(rank: int, port: int, results) -> None:
    """One rank of a two-rank FSDP2 group (gloo) running the policy with precision: bf16."""
    import os

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    ctx = WorkerContext(worker="actor", kind="training", replica=rank, replicas=2)
    backend = get_backend(ctx, BackendOptions(precision="bf16"))
    model = backend.wrap(vit_args().build())
    compute_dtypes = []
    model.blocks[0].fc1.register_forward_hook(lambda m, i, o: compute_dtypes.append((m.weight.dtype, o.dtype)))
    loss, grads = loss_and_grads_of(model, backend, observation())
    results.put(
        {
            "loss": float(loss),
            "compute": compute_dtypes[0],
            "masters": {p.dtype for p in model.parameters()},
            "grads": {g.dtype for g in grads.values()},
        }
    )
    dist.destroy_process_group()


def test_bf16_on_two_fsdp2_ranks_computes_in_bf16_keeps_fp32_masters_and_a_close_loss():
    import torch.multiprocessing as mp

    from m2flow.runtime.distributed import free_port

    torch.manual_seed(0)
    reference, _ = loss_and_grads(vit_args().build(), observation(), BackendOptions())
    results = mp.get_context("spawn").Queue()
    mp.spawn(_bf16_rank, args=(free_port(), results), nprocs=2)
    ranks = [results.get(timeout=60) for _ in range(2)]
    for rank in ranks:
        assert rank["compute"] == (torch.bfloat16, torch.bfloat16)  # sharded parameters gathered in bf16
        assert rank["masters"] == {torch.float32} and rank["grads"] == {torch.float32}
        assert rank["loss"] != float(reference)  # bf16 changed the arithmetic...
        assert rank["loss"] == pytest.approx(float(reference), rel=0.02)  # ...within bf16's rounding


def test_a_model_without_blocks_cannot_checkpoint_activations():
    from m2flow.errors import SpecError

    model = PolicyArgs(env_id="HalfCheetah-v5").build()
    backend = get_backend(WorkerContext(worker="actor", kind="training"), BackendOptions(activation_checkpointing=True))
    with pytest.raises(SpecError, match="workers.actor.args.activation_checkpointing"):
        backend.wrap(model)


def test_qkv_rows_reorder_to_megatrons_per_head_interleave_and_back():
    from m2flow.workers.actor.megatron_gpt import qkv_from_megatron, qkv_to_megatron

    heads, head_dim, width = 2, 3, 4
    weight = torch.arange(3 * heads * head_dim * width, dtype=torch.float32).reshape(3 * heads * head_dim, width)
    megatron = qkv_to_megatron(weight, heads)
    q, k, v = weight.chunk(3)
    first_head = torch.cat([q[:head_dim], k[:head_dim], v[:head_dim]])  # Megatron: head 0's q, k, v, then head 1's
    torch.testing.assert_close(megatron[: 3 * head_dim], first_head)
    torch.testing.assert_close(qkv_from_megatron(megatron, heads), weight)
    bias = torch.arange(3 * heads * head_dim, dtype=torch.float32)
    torch.testing.assert_close(qkv_from_megatron(qkv_to_megatron(bias, heads), heads), bias)


def test_megatron_vit_policies_need_cuda_and_say_so():
    from m2flow.errors import SpecError

    backend = get_backend(WorkerContext(worker="actor", kind="training", backend="megatron"))
    with pytest.raises(
        SpecError, match="workers.actor.backend: megatron runs a vit policy on megatron-core's GPTModel"
    ):
        backend.wrap(vit_args(causal=True).build())


def test_bf16_inference_acts_within_bf16_rounding_of_fp32_and_hands_back_float32():
    from m2flow.context import set_context
    from m2flow.workers.rollout import TorchPolicy

    obs = {k: v.numpy() for k, v in observation(8).items()} | {"env_id": np.arange(8)}
    outputs = {}
    for precision in ("fp32", "bf16"):
        set_context(WorkerContext(worker="rollout", kind="inference", seed=1))
        policy = TorchPolicy(env_id="HalfCheetah-v5", model="vit", observation=VIEW, size="1m", precision=precision)
        outputs[precision] = policy.act(obs)
    for key in ("action", "logprob", "value"):
        assert outputs["bf16"][key].dtype == np.float32
        np.testing.assert_allclose(outputs["bf16"][key], outputs["fp32"][key], rtol=0.05, atol=0.05)
    assert not np.array_equal(outputs["bf16"]["value"], outputs["fp32"]["value"])  # it did compute in bf16
