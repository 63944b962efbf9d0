"""What a training forward really keeps for its backward, to check the planner's activation estimate."""

from __future__ import annotations

import contextlib

import torch


def saved_for_backward(model: torch.nn.Module, obs: dict[str, torch.Tensor], bf16: bool = False) -> int:
    """Bytes a forward of `model` (an actor-critic; under bf16 autocast if asked) keeps for its backward:
    distinct storages, parameters left out. Runs the backward too, so the model must be in training mode."""
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in weights:
            storages[ptr] = t.untyped_storage().nbytes()
        return t

    compute = torch.autocast("cpu", torch.bfloat16) if bf16 else contextlib.nullcontext()
    with compute, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _, logprob, entropy, value = model(obs)
    (logprob.sum() + entropy.sum() + value.sum()).backward()
    return sum(storages.values())
