"""Every process group of a training worker bounds a collective by the plan's deadline, never torch's or
megatron-core's 30 minutes: the runtime's default group, a single rank's group of one, the device mesh
FSDP2 shards over, Megatron's model-parallel groups (two real gloo ranks)."""

from __future__ import annotations

import datetime

import pytest
import torch

from m2flow.context import WorkerContext

PLAN_S = 7.5


def group_timeout(group) -> datetime.timedelta:
    """The timeout a gloo group's collectives run under."""
    return group._get_backend(torch.device("cpu")).options._timeout


def _megatron_rank(rank: int, port: int, results) -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state

    from m2flow.runtime.distributed import init_process_group
    from m2flow.workers.actor import BackendOptions, get_backend
    from m2flow.workers.models import PolicyArgs

    ctx = WorkerContext(
        worker="actor", kind="training", replica=rank, replicas=2, backend="megatron", collective_s=PLAN_S
    )
    init_process_group(ctx, "127.0.0.1", port, meet_s=60)
    backend = get_backend(ctx, BackendOptions())
    backend.wrap(PolicyArgs(env_id="Pendulum-v1").build())
    groups = {
        "default": dist.distributed_c10d._get_default_group(),
        "device mesh": backend.world_mesh().get_group(),
        "tensor parallel": parallel_state.get_tensor_model_parallel_group(),
        "data parallel": parallel_state.get_data_parallel_group(),
        "pipeline parallel": parallel_state.get_pipeline_model_parallel_group(),
        "model parallel": parallel_state.get_model_parallel_group(),
    }
    results.put((rank, {name: group_timeout(group).total_seconds() for name, group in groups.items()}))
    dist.destroy_process_group()


def test_megatron_model_parallel_groups_take_the_plans_collective_deadline():
    import torch.multiprocessing as mp

    from m2flow.runtime.distributed import free_port

    pytest.importorskip("megatron.core", reason="megatron-core is the `megatron` extra")
    spawn = mp.get_context("spawn")
    results, port = spawn.Queue(), free_port()
    ranks = [spawn.Process(target=_megatron_rank, args=(r, port, results)) for r in range(2)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join(timeout=180)
        if p.is_alive():  # hung: ended here, failed below
            p.kill()
    assert [p.exitcode for p in ranks] == [0, 0]  # a rank that failed says why in the output above
    seen = dict(results.get(timeout=5) for _ in ranks)
    assert set(seen) == {0, 1}
    for rank, timeouts in seen.items():
        assert timeouts == dict.fromkeys(timeouts, PLAN_S), f"rank {rank}: {timeouts}"


def _single_rank(results) -> None:
    import torch.distributed as dist

    from m2flow.workers.actor import BackendOptions, get_backend

    ctx = WorkerContext(worker="actor", kind="training", backend="fsdp", collective_s=PLAN_S)
    mesh = get_backend(ctx, BackendOptions()).world_mesh()  # a group of one, made for the mesh (sharding)
    groups = {"default": dist.distributed_c10d._get_default_group(), "device mesh": mesh.get_group()}
    results.put({name: group_timeout(group).total_seconds() for name, group in groups.items()})
    dist.destroy_process_group()


def test_a_single_ranks_group_of_one_and_its_device_mesh_take_the_plans_collective_deadline():
    import torch.multiprocessing as mp

    spawn = mp.get_context("spawn")
    results = spawn.Queue()
    rank = spawn.Process(target=_single_rank, args=(results,))
    rank.start()
    rank.join(timeout=180)
    if rank.is_alive():  # hung: ended here, failed below
        rank.kill()
    assert rank.exitcode == 0  # a rank that failed says why in the output above
    assert results.get(timeout=5) == {"default": PLAN_S, "device mesh": PLAN_S}
