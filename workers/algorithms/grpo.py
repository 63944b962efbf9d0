"""Group relative advantages (GRPO, Shao et al. 2024), as RLinf's embodied recipes use them: groups of
G envs start from the same initial state; each env's advantage is its return minus its group's mean,
optionally divided by the group's standard deviation. No critic."""

from __future__ import annotations

import torch


def group_advantages(
    returns: torch.Tensor, group_size: int, normalize_std: bool = True, epsilon: float = 1e-6
) -> torch.Tensor:
    """`returns[N]`, envs of a group adjacent (env ids g*G .. g*G+G-1) -> advantages[N]."""
    if returns.numel() % group_size:
        raise ValueError(f"{returns.numel()} envs do not split into groups of {group_size}")
    groups = returns.reshape(-1, group_size)
    advantages = groups - groups.mean(dim=1, keepdim=True)
    if normalize_std:
        advantages = advantages / (groups.std(dim=1, unbiased=False, keepdim=True) + epsilon)
    return advantages.reshape(-1)
