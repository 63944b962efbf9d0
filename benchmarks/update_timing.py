"""How long one training update takes on a fixed batch, as the training benchmarks time it."""

from __future__ import annotations

import time
from typing import Any

import torch


def seconds_per_update(trainer: Any, data: dict, repeats: int, cuda: bool) -> float:
    """One warm-up update (kernels, allocator, optimizer state), then the mean of `repeats` updates; on
    CUDA the peak memory counts from after the warm-up."""
    trainer.train([data])
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    began = time.perf_counter()
    for _ in range(repeats):
        trainer.train([data])
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - began) / repeats
