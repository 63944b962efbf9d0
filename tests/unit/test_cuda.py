"""CUDA-only paths, run on the GPU machine (`pytest -m gpu`, benchmarks/gpu_session.sh tests); skipped
elsewhere with the reason. The CPU-testable logic of each is tested in the other unit tests."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from m2flow.context import WorkerContext, set_context
from m2flow.workers.actor import PPO
from m2flow.workers.models.host_copy import from_host
from m2flow.workers.rollout import TorchPolicy
from m2flow.workers.synthetic import SyntheticBatch
from tests.batches import pendulum_minibatches

pytestmark = pytest.mark.gpu


def needs_megatron() -> None:
    pytest.importorskip("megatron.core", reason="megatron-core is the `megatron` extra")


VIEW = {"cameras": ["track"], "modalities": ["rgb", "proprio"], "size": (64, 64)}
VIT = {"env_id": "HalfCheetah-v5", "model": "vit", "observation": VIEW, "size": "1m", "causal": True}


def on_cuda(kind: str, backend: str | None = None) -> None:
    set_context(WorkerContext(worker=kind, kind=kind, device="cuda", backend=backend, seed=1))


def camera_obs(policy, n: int = 8) -> dict[str, torch.Tensor]:
    data = SyntheticBatch(1, n, seed=3).trajectory()
    return policy.model.inputs({k: v[0] for k, v in data["obs"].items()}, torch.device("cuda"))


def cheetah_batch(behaviour_logprob: float, steps: int = 8, envs: int = 4) -> dict:
    """A HalfCheetah trajectory of random steps, as a simulator sends it (observations as a dict)."""
    rng = np.random.default_rng(0)
    return {
        "obs": {"obs": rng.normal(size=(steps, envs, 17)).astype(np.float32)},
        "action": rng.normal(size=(steps, envs, 6)).astype(np.float32),
        "logprob": rng.normal(behaviour_logprob, 0.5, size=(steps, envs)).astype(np.float32),
        "value": rng.normal(size=(steps, envs)).astype(np.float32),
        "reward": rng.normal(size=(steps, envs)).astype(np.float32),
        "done": np.zeros((steps, envs), np.float32),
        "next_obs": {"obs": rng.normal(size=(envs, 17)).astype(np.float32)},
        "next_done": np.zeros(envs, np.float32),
    }


def test_offload_moves_the_policy_to_pinned_host_memory_and_back_unchanged():
    on_cuda("inference")
    policy = TorchPolicy(**VIT)
    obs = camera_obs(policy)
    with torch.no_grad():
        before = policy.model.mean_action(obs)
    policy.offload()
    assert all(p.device.type == "cpu" and p.is_pinned() for p in policy.model.parameters())
    policy.onload()
    assert all(p.is_cuda for p in policy.model.parameters())
    with torch.no_grad():
        torch.testing.assert_close(policy.model.mean_action(obs), before, rtol=0, atol=0)


def test_the_megatron_gpt_trunk_computes_the_plain_vits_outputs():
    needs_megatron()
    on_cuda("training", "fsdp")
    plain = PPO(**VIT, num_minibatches=1, update_epochs=1)
    on_cuda("training", "megatron")
    gpt = PPO(**VIT, num_minibatches=1, update_epochs=1)
    obs = camera_obs(plain)
    actions = torch.zeros(8, 6, device="cuda")
    with torch.no_grad():
        _, logprob_a, _, value_a = plain.model.get_action_and_value(obs, actions)
        _, logprob_b, _, value_b = gpt.model.get_action_and_value(obs, actions)
    torch.testing.assert_close(logprob_b, logprob_a, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(value_b, value_a, rtol=1e-5, atol=1e-5)


def test_a_megatron_checkpoint_loads_into_a_fused_adam_on_cuda_and_trains_on(tmp_path):
    """Adam's state made before the load (to be filled in) lives where the fused CUDA kernel reads it."""
    needs_megatron()
    on_cuda("training", "megatron")
    first = PPO(**VIT, num_minibatches=2, update_epochs=1, normalize_reward=False)
    first.train([SyntheticBatch(4, 8, seed=1).trajectory()])
    first.save_checkpoint(str(tmp_path / "actor"))
    resumed = PPO(**VIT, num_minibatches=2, update_epochs=1, normalize_reward=False)
    resumed.load_checkpoint(str(tmp_path / "actor"))
    metrics = resumed.train([SyntheticBatch(4, 8, seed=2).trajectory()])
    assert torch.isfinite(torch.tensor(metrics["actor/loss"]))
    assert resumed.version == 2


def _megatron_groups_on_cuda(collective_s: float, results) -> None:
    """A one-rank Megatron ViT worker's groups (NCCL for CUDA tensors) and the timeouts they run under."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    context = WorkerContext(worker="training", kind="training", device="cuda", backend="megatron", seed=1)
    set_context(context.with_(collective_s=collective_s))
    PPO(**VIT, num_minibatches=1, update_epochs=1)
    groups = {
        "default": dist.distributed_c10d._get_default_group(),
        "tensor parallel": parallel_state.get_tensor_model_parallel_group(),
        "data parallel": parallel_state.get_data_parallel_group(),
        "model parallel": parallel_state.get_model_parallel_group(),
    }
    cuda = torch.device("cuda")
    results.put({name: group._get_backend(cuda).options._timeout.total_seconds() for name, group in groups.items()})


def test_megatron_groups_on_nccl_take_the_plans_collective_deadline():
    needs_megatron()
    import torch.multiprocessing as mp

    spawn = mp.get_context("spawn")
    results = spawn.Queue()
    rank = spawn.Process(target=_megatron_groups_on_cuda, args=(7.5, results))
    rank.start()
    rank.join(timeout=240)
    if rank.is_alive():  # hung: ended here, failed below
        rank.kill()
    assert rank.exitcode == 0  # a rank that failed says why in the output above
    timeouts = results.get(timeout=5)
    assert timeouts == dict.fromkeys(timeouts, 7.5)


def test_fsdp2_cpu_offload_trains_with_parameters_on_the_host():
    on_cuda("training", "fsdp")
    ppo = PPO(**VIT, num_minibatches=2, update_epochs=1, cpu_offload=True, normalize_reward=False)
    before = {k: v.clone() for k, v in ppo.backend.full_state_dict(ppo.model).items()}
    metrics = ppo.train([SyntheticBatch(4, 8, seed=1).trajectory()])
    assert all(p.device.type == "cpu" for p in ppo.model.parameters())  # the shards live on the host
    after = ppo.backend.full_state_dict(ppo.model)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert torch.isfinite(torch.tensor(metrics["actor/loss"]))


@pytest.mark.parametrize("clip_vloss", [True, False])
def test_a_one_rank_ppo_update_runs_on_cuda_with_and_without_value_clipping(clip_vloss):
    """One rank, no sharding: the update's statistics (some made inside the loss) are summed on the device."""
    on_cuda("training", "fsdp")
    ppo = PPO(env_id="HalfCheetah-v5", hidden=[32, 32], minibatch_size=16, update_epochs=2, clip_vloss=clip_vloss)
    batch = cheetah_batch(behaviour_logprob=-5.0)
    before = [p.detach().clone() for p in ppo.model.parameters()]
    metrics = ppo.train([batch])
    assert all(p.device.type == "cuda" for p in ppo.model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, ppo.model.parameters(), strict=True))
    assert all(np.isfinite(v) for k, v in metrics.items() if k.startswith("actor/"))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_decoupled_ppo_recomputes_a_stale_batch_on_cuda(precision):
    """Samples one version old (flow.async): values and log-probs recomputed on the device, weights capped."""
    on_cuda("training", "fsdp")
    ppo = PPO(env_id="HalfCheetah-v5", hidden=[32, 32], minibatch_size=16, update_epochs=1, precision=precision)
    batch = {**cheetah_batch(behaviour_logprob=-8.0), "policy_version": np.full((8, 4), -1, np.int64)}
    metrics = ppo.train([batch])
    assert metrics["actor/staleness_max"] == 1.0
    assert 0 < metrics["actor/behavior_weight_mean"] <= ppo.cfg.behavior_weight_cap
    assert all(np.isfinite(v) for k, v in metrics.items() if k.startswith("actor/"))


def test_sac_updates_on_cuda():
    from m2flow.workers.actor import SAC

    on_cuda("training")
    sac = SAC(env_id="Pendulum-v1", hidden=[32, 32])
    batch = {**pendulum_minibatches(2, 16), "weight": np.ones((2, 16), np.float32)}  # prioritised replay's
    metrics = sac.train([batch])
    assert metrics["actor/updates"] == 2.0 and all(p.device.type == "cuda" for p in sac.actor.parameters())
    assert all(np.isfinite(v) for v in metrics.values())


def test_sac_from_pixels_updates_its_cnns_on_cuda():
    from m2flow.workers.actor import SAC

    on_cuda("training")
    view = {"cameras": ["track"], "modalities": ["rgb"], "size": [64, 64]}
    sac = SAC(env_id="HalfCheetah-v5", hidden=[64, 64], observation=view)
    rng = np.random.default_rng(0)
    frames = lambda: rng.integers(0, 256, size=(2, 16, 1, 64, 64, 3), dtype=np.uint8)  # noqa: E731
    batch = {
        "obs": {"rgb": frames()},
        "next_obs": {"rgb": frames()},
        "action": rng.uniform(-1, 1, size=(2, 16, 6)).astype(np.float32),
        "reward": rng.normal(size=(2, 16)).astype(np.float32),
        "terminal": np.zeros((2, 16), np.float32),
        "index": np.arange(32).reshape(2, 16),
    }
    metrics = sac.train([batch])
    assert metrics["actor/updates"] == 2.0 and all(np.isfinite(v) for v in metrics.values())
    assert all(p.device.type == "cuda" for p in [*sac.critic.encoder.parameters(), *sac.actor.encoder.parameters()])


def test_bf16_computes_in_bf16_on_cuda():
    on_cuda("training", "fsdp")
    ppo = PPO(**VIT, num_minibatches=2, update_epochs=1, precision="bf16")
    seen = []
    ppo.model.blocks[0].fc1.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    ppo.train([SyntheticBatch(4, 8, seed=1).trajectory()])
    assert seen and set(seen) == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in ppo.model.parameters())


def _receive_over_cuda_ipc(manifests, results, keep_mapping: bool) -> None:
    import gc

    from m2flow.runtime.weight_sync import CudaIpcTransport, Route

    receiver = CudaIpcTransport(Route("cuda_ipc", rank=1, world=2, keep_mapping=keep_mapping), "cuda")
    while (manifest := manifests.get(timeout=120)) is not None:
        value = receiver.receive(manifest)
        # numpy (bf16 widened exactly to fp32): tensors on a queue would outlive this process in shared memory
        results.put({"version": value["version"], **{k: v.float().cpu().numpy() for k, v in value["state"].items()}})
        del value
    receiver.forget()
    gc.collect()
    torch.cuda.synchronize()
    results.put("released")


@pytest.mark.parametrize("keep_mapping", [True, False])
def test_cuda_ipc_hands_states_over_bit_for_bit_refilling_its_buckets_and_frees_them_once_handed_back(keep_mapping):
    import torch.multiprocessing as mp

    from m2flow.runtime.weight_sync import CudaIpcTransport, Route

    first = {"w": torch.randn(1000, 1000, device="cuda"), "b": torch.randn(7, device="cuda").bfloat16()}
    states = [first, {k: v * 2 for k, v in first.items()}, {k: v * 3 for k, v in first.items()}]
    states.append({"w": torch.randn(10, 3, device="cuda")})  # a new layout: new buckets
    before = torch.cuda.memory_allocated()
    sender = CudaIpcTransport(Route("cuda_ipc", world=2), "cuda")  # holds the buckets the receiver maps
    context = mp.get_context("spawn")
    manifests, results = context.Queue(), context.Queue()
    receiver = context.Process(target=_receive_over_cuda_ipc, args=(manifests, results, keep_mapping))
    receiver.start()
    got = []
    for version, state in enumerate(states, start=3):  # each sync after the last one's copy, as the phase runs
        manifests.put(sender.publish({"version": version, "state": state}))
        got.append(results.get(timeout=120))
    manifests.put(None)
    assert results.get(timeout=120) == "released"
    receiver.join(60)
    for version, (state, received) in enumerate(zip(states, got, strict=True), start=3):
        assert received["version"] == version
        for name, tensor in state.items():
            assert torch.equal(torch.from_numpy(received[name]), tensor.float().cpu()), (version, name)
    sender.forget()
    torch.cuda.ipc_collect()  # blocks whose every share was handed back are freed
    assert torch.cuda.memory_allocated() == before


def test_a_checksum_summed_on_the_gpu_matches_the_same_state_summed_on_the_cpu():
    from m2flow.workers.models.checksum import checksum_matches, state_checksum

    state = {"a": torch.randn(3000, 1000, device="cuda"), "b": torch.randn(7, device="cuda").bfloat16()}
    state |= {f"small{i:03d}": torch.randn(100, device="cuda") for i in range(200)}  # laid end to end in groups
    state["big"] = torch.randn(2**23 + 5, device="cuda")  # past a group's size: summed alone
    state["on_cpu"] = torch.randn(50)  # a state across devices: a sum per device
    assert checksum_matches({k: v.cpu() for k, v in state.items()}, state_checksum(state))


def test_an_hf_backbone_loads_straight_onto_the_worker_s_gpu_and_acts_there(tmp_path):
    import numpy as np

    from m2flow.workers.models import PolicyArgs
    from m2flow.workers.models.hf_tiny import make_tiny_vlm

    folder = make_tiny_vlm(tmp_path / "vlm")
    view = {"cameras": ["track"], "modalities": ["rgb"], "size": (32, 32)}
    args = {"env_id": "HalfCheetah-v5", "model": "hf", "observation": view, "hf": {"path": str(folder)}}
    on_cuda("inference")
    built = PolicyArgs(**args).build()
    assert {p.device.type for p in built.backbone.parameters()} == {"cuda"}  # not through host memory
    policy = TorchPolicy(**args, precision="bf16")
    rgb = np.random.default_rng(0).integers(0, 255, (4, 1, 32, 32, 3), dtype=np.uint8)
    out = policy.act({"rgb": rgb, "env_id": np.arange(4)})
    assert out["action"].shape == (4, 6) and np.isfinite(out["logprob"]).all()


def test_back_to_back_copies_through_pinned_memory_each_arrive_intact():
    """The second copy's pinned block must not be the first's while the first is still in flight."""
    cuda = torch.device("cuda")
    first, second = np.zeros((1024, 1024), np.float32), np.ones((1024, 1024), np.float32)
    a, b = from_host(first, cuda), from_host(second, cuda)
    assert a.is_cuda and float(a.sum()) == 0.0 and float(b.sum()) == 1024 * 1024


def test_without_pinned_memory_the_copy_falls_back_to_the_synchronous_one(monkeypatch):
    empty = torch.empty

    def no_pinning(*args, pin_memory=False, **kwargs):
        if pin_memory:
            raise RuntimeError("cannot lock memory")
        return empty(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", no_pinning)
    tensor = from_host(np.arange(12, dtype=np.int64).reshape(3, 4), torch.device("cuda"))
    assert tensor.is_cuda and torch.equal(tensor.cpu(), torch.arange(12).reshape(3, 4))


def test_an_array_past_the_pinned_limit_takes_the_synchronous_copy(monkeypatch):
    from m2flow.workers.models import host_copy

    monkeypatch.setattr(host_copy, "PINNED_MAX_BYTES", 1024)
    empty = torch.empty

    def pinning_refused(*args, pin_memory=False, **kwargs):
        assert not pin_memory, "a large array must not be pinned"
        return empty(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", pinning_refused)
    tensor = from_host(np.ones((64, 64), np.float32), torch.device("cuda"))
    assert tensor.is_cuda and float(tensor.sum()) == 64 * 64


def camera_batch(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    rgb = rng.integers(0, 255, (n, 1, 64, 64, 3), dtype=np.uint8)
    return {"rgb": rgb, "proprio": rng.normal(size=(n, 17)).astype(np.float32), "env_id": np.arange(n)}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_graphed_act_call_gives_the_eager_actions_per_shape_after_new_weights_and_after_offload(precision):
    on_cuda("inference")
    graphed, eager = TorchPolicy(**VIT, precision=precision), TorchPolicy(**VIT, precision=precision, cuda_graphs=False)
    eager.model.load_state_dict(graphed.model.state_dict())
    tolerance = {"rtol": 1e-4, "atol": 1e-4} if precision == "fp32" else {"rtol": 2e-2, "atol": 2e-2}

    def same(batch) -> None:
        got, want = graphed.act(batch), eager.act(batch)
        for key in ("action", "logprob", "value"):
            np.testing.assert_allclose(got[key], want[key], **tolerance, err_msg=key)

    for n, seed in [(8, 0), (8, 1), (12, 2), (8, 3)]:  # a replay reads each call's own inputs
        same(camera_batch(n, seed))
    assert len(graphed.graphs.graphs) == 2 and graphed.graphs.failed is None, "one graph per batch shape"
    state = {k: v + 0.01 if v.is_floating_point() else v for k, v in graphed.model.state_dict().items()}
    for policy in (graphed, eager):
        policy.load_weights({"version": 1, "state": state})
    same(camera_batch(8, 4))  # weights load in place: the graphs see them
    graphed.offload()
    graphed.onload()
    assert not graphed.graphs.graphs, "moving the parameters forgets the graphs that hold their addresses"
    same(camera_batch(12, 5))


def test_a_forward_that_cannot_be_captured_runs_eager_and_says_so(capsys):
    from m2flow.workers.models.cuda_graph import CudaGraphs

    graphs = CudaGraphs(torch.device("cuda"))
    x = torch.arange(4.0, device="cuda")
    assert graphs.run("sum", lambda t: t * t.sum().item(), x).tolist() == [0.0, 6.0, 12.0, 18.0]
    assert graphs.failed is not None and not graphs.graphs
    assert "m2flow: sum runs eager, its forward cannot be replayed as a CUDA graph" in capsys.readouterr().err
    assert graphs.run("sum", lambda t: t + 1, x).tolist() == [1.0, 2.0, 3.0, 4.0], "eager from then on"
    # the failed capture left the process's random draws working, and other forwards capturable
    assert torch.randn(3, device="cuda").isfinite().all()
    other = CudaGraphs(torch.device("cuda"))
    assert other.run("noise", lambda t: t + torch.randn_like(t), x).shape == (4,) and other.failed is None


def test_a_graphed_act_call_without_env_ids_draws_fresh_noise_at_each_replay():
    on_cuda("inference")
    policy = TorchPolicy(**VIT)
    batch = {k: v for k, v in camera_batch(8, 0).items() if k != "env_id"}
    first, second = policy.act(batch), policy.act(batch)
    assert len(policy.graphs.graphs) == 1 and policy.graphs.failed is None
    assert np.isfinite(first["action"]).all() and not np.array_equal(first["action"], second["action"])
    np.testing.assert_array_equal(first["value"], second["value"])  # the same observations, the same values


SHARED_GPU_PROCESS = """
import sys, torch
from m2flow.context import WorkerContext
from m2flow.runtime.host import PortFailed, WorkerHost
from tests.workers_for_tests import GrabsGpuMemory

share_gb = 6.0
ctx = WorkerContext(worker="rollout", device="cuda", output_dir=sys.argv[1], gpu_memory_gb=share_gb)
host = WorkerHost(GrabsGpuMemory, {}, ctx, 1, None)
host._invoke(host.instances[0], "grab", (0.5 * share_gb,), "call")  # within its share
try:
    host._invoke(host.instances[0], "grab", (2 * share_gb,), "call")  # twice its share: the GPU has it
except PortFailed as failure:
    print(failure.headline())
"""


def test_a_process_given_a_memory_share_runs_out_at_its_share_and_is_told_which_key_to_declare(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    out = subprocess.run(
        [sys.executable, "-c", SHARED_GPU_PROCESS, str(tmp_path)], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert "workers.rollout ran out of its share of the GPU's memory (6 GB" in out.stdout, out.stdout
