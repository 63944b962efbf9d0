"""torch.distributed process groups for multi-rank workers (gloo on CPU, NCCL on CUDA)."""

from __future__ import annotations

import os
import socket


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def backend_for(device: str) -> str:
    """NCCL for CUDA tensors plus gloo for CPU ones on GPU workers (metrics, checkpoint metadata)."""
    return "cpu:gloo,cuda:nccl" if device.startswith("cuda") else "gloo"


def init_process_group(rank: int, world_size: int, address: str, port: int, device: str, timeout_s: float) -> None:
    import datetime

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR=address, MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    dist.init_process_group(
        backend_for(device), rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s)
    )
