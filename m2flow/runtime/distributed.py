"""torch.distributed process groups for multi-rank workers (gloo on CPU, NCCL on CUDA)."""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path
from typing import Any

from m2flow.context import WorkerContext
from m2flow.errors import WorkerError

EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 10000
PORT_TAKEN = "EADDRINUSE"  # how torch's store says the port it was to listen on is bound already


def free_port() -> int:
    """A port free now for a process group's store to listen on, outside the kernel's ephemeral range: a port
    the kernel hands out to outgoing connections (Ray opens many) can be taken by one between this check and
    the store's listen, which then fails with EADDRINUSE."""
    low, high = ephemeral_range()
    outside = [span for span in ((LOWEST_PORT, low - 1), (high + 1, 65535)) if span[0] <= span[1]]
    draw = random.SystemRandom()
    for _ in range(64 if outside else 0):
        first, last = draw.choice(outside)
        port = draw.randint(first, last)
        with socket.socket() as sock:
            try:
                sock.bind(("", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:  # every draw taken: any port the kernel has free
        sock.bind(("", 0))
        return sock.getsockname()[1]


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel gives outgoing connections (Linux's default where it cannot be read)."""
    try:
        low, high = (int(part) for part in EPHEMERAL.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def backend_for(device: str) -> str:
    """NCCL for CUDA tensors plus gloo for CPU ones on GPU workers (metrics, checkpoint metadata)."""
    return "cpu:gloo,cuda:nccl" if device.startswith("cuda") else "gloo"


def init_process_group(ctx: WorkerContext, address: str, port: int, meet_s: float) -> None:
    """Join the worker's default process group: its ranks meet through a TCP store within `meet_s` (start-up
    may be slow), then every collective is bounded by `ctx.collective_s`, derived from the plan, never torch's
    default of 30 minutes. A rank that does not come names itself and the group."""
    import torch.distributed as dist

    rank, world = ctx.replica, ctx.replicas
    os.environ.update(MASTER_ADDR=address, MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    store = meet(f"worker '{ctx.worker}'", address, port, rank, world, meet_s)
    dist.init_process_group(
        backend_for(ctx.device), store=store, rank=rank, world_size=world, timeout=ctx.collective_timeout
    )


def meet(group: str, address: str, port: int, rank: int, world: int, meet_s: float) -> Any:
    """The TCP store through which a group's ranks meet (rank 0 hosts it), once all `world` have come within
    `meet_s`; else an error naming the group and the rank. Peers are reached through the node's interface."""
    import datetime

    import torch.distributed as dist

    use_node_interface()
    try:
        return dist.TCPStore(address, port, world, is_master=rank == 0, timeout=datetime.timedelta(seconds=meet_s))
    except (RuntimeError, TimeoutError) as exc:
        if rank == 0 and PORT_TAKEN in str(exc):
            raise WorkerError(
                f"{group}: rank 0 could not host its process group's store at {address}:{port}: another process"
                f" took the port after it was found free ({exc}); start the run again (the next draws another port)"
            ) from None
        raise WorkerError(
            f"{group}: rank {rank} of {world} could not meet its process group at {address}:{port} within"
            f" {meet_s:g}s ({exc}); did another of its replicas fail to start? Its log says why"
        ) from None


def use_node_interface() -> None:
    """Make gloo and NCCL reach peers through the interface that holds this Ray node's address. Left to
    themselves they take the address the host name resolves to, which is often 127.0.0.1: fine on one
    host, refused from another. A user's own GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME win."""
    import psutil
    import ray

    node_ip = ray.util.get_node_ip_address()
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == node_ip for a in addresses):
            os.environ.setdefault("GLOO_SOCKET_IFNAME", name)
            os.environ.setdefault("NCCL_SOCKET_IFNAME", name)
            return
