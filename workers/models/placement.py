"""Move a model (and its optimizer state) between a GPU and pinned host memory, for context switches."""

from __future__ import annotations

import torch
from torch import nn


def move_module(module: nn.Module, device: torch.device) -> None:
    """Parameters, gradients and buffers to `device`; to pinned memory when that is the CPU."""
    for tensor in [*module.parameters(), *module.buffers()]:
        tensor.data = _to(tensor.data, device)
        if tensor.grad is not None:
            tensor.grad = _to(tensor.grad, device)


def move_optimizer(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                state[key] = _to(value, device)


def _to(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    moved = tensor.to(device, non_blocking=True)
    return moved.pin_memory() if device.type == "cpu" and torch.cuda.is_available() else moved
