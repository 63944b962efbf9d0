"""The compute precision a worker asks for (`precision: fp32 | bf16`) and the context that applies it."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

Precision = Literal["fp32", "bf16"]


def compute_in(device: torch.device, precision: Precision, cache: bool = True) -> contextlib.AbstractContextManager:
    """bf16 autocast on `device` (the weights stay as they are), or nothing for fp32. `cache=False` while a
    CUDA graph is captured: autocast's cast weights must not outlive the capture."""
    import torch

    if precision != "bf16":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=cache)
