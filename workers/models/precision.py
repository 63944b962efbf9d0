"""The compute precision a worker asks for (`precision: fp32 | bf16`) and the context that applies it."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

Precision = Literal["fp32", "bf16"]


def compute_in(device: torch.device, precision: Precision) -> contextlib.AbstractContextManager:
    """bf16 autocast on `device` (the weights stay as they are), or nothing for fp32."""
    import torch

    return torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
