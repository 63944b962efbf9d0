"""The diagonal Gaussian action head's arithmetic, written out: a state-independent log-std shared by every
sample. The same values as `torch.distributions.Normal(mean, log_std.exp())` summed over action dims,
at a fraction of its cost: no distribution object, no argument validation, no [n, act_dim] copy of the
std, the entropy computed once per call (it does not depend on the sample) — a PPO update calls this
hundreds of times per iteration, on a CPU where every op's fixed cost outweighs a small MLP's FLOPs."""

from __future__ import annotations

import math

import torch

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def gaussian_head(
    mean: torch.Tensor, log_std: torch.Tensor, action: torch.Tensor | None, noise: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(action, log-prob, entropy) of N(mean, exp(log_std)) with `log_std` [1, act_dim]; a new action is
    mean + std * noise (standard normal noise drawn here when none is given)."""
    std = log_std.exp()
    if action is None:
        action = mean + std * (torch.randn_like(mean) if noise is None else noise)
    z = (action - mean) / std
    logprob = (-0.5 * z.square() - log_std - LOG_SQRT_2PI).sum(-1)
    entropy = (0.5 + LOG_SQRT_2PI + log_std).sum(-1).expand(mean.shape[0])
    return action, logprob, entropy
