"""A process's share of its GPU's memory, from the plan (`planners/memory`): its CUDA caching allocator is
capped there, and running out of it is explained as the plan's share, with the key that sets the estimate."""

from __future__ import annotations

import sys

from m2flow.context import WorkerContext
from m2flow.planners.memory import USABLE


def cap_gpu_memory(gb: float) -> None:
    """Cap this process's CUDA caching allocator at `gb` of its (only visible) GPU's memory: the plan's share
    of the capacity it planned for, whatever the GPU holds."""
    import torch

    if torch.cuda.is_available():
        device = torch.cuda.current_device()
        total = torch.cuda.get_device_properties(device).total_memory
        if gb * 2**30 > USABLE * total:  # the plan assumed a larger GPU than this one
            print(
                f"m2flow: the plan gives this process {gb:.3g} GB of its GPU, which holds {total / 2**30:.3g} GB;"
                f" capped at {USABLE:.0%} of it. Set cluster.gpu_memory_gb to the GPUs' size",
                file=sys.stderr,
            )
        torch.cuda.set_per_process_memory_fraction(min(USABLE, gb * 2**30 / total), device)


def out_of_share(ctx: WorkerContext, exc: BaseException) -> str:
    """What to do when a process ran out of its GPU memory share; empty for any other error."""
    if ctx.gpu_memory_gb is None or type(exc).__name__ != "OutOfMemoryError":
        return ""
    return (
        f"workers.{ctx.worker} ran out of its share of the GPU's memory ({ctx.gpu_memory_gb:.3g} GB: what the plan"
        " leaves it beside the other processes on that GPU, from their memory estimates). Declare what it needs"
        f" in workers.{ctx.worker}.resources.memory_gb (or lower the others'), or give it a GPU of its own"
    )
