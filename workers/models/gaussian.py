"""The diagonal Gaussian action head written out, in fp32: what `torch.distributions.Normal` gives (up to
rounding) without its per-call object, argument checks and per-sample std — on a CPU, each op's fixed
cost outweighs a small MLP's FLOPs, and a PPO update calls this once per minibatch."""

from __future__ import annotations

import math

import torch

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def gaussian_head(
    mean: torch.Tensor, log_std: torch.Tensor, action: torch.Tensor | None, noise: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(action, log-prob, entropy) of N(mean, exp(log_std)) with `log_std` [1, act_dim]; a new action is
    mean + std * noise (standard normal noise drawn here when none is given). Computed in fp32 whatever the
    model's compute dtype, as the inference worker computes it."""
    mean, log_std = mean.float(), log_std.float()
    std = log_std.exp()
    if action is None:
        action = mean + std * (torch.randn_like(mean) if noise is None else noise)
    z = (action - mean) / std
    logprob = (-0.5 * z.square() - log_std - LOG_SQRT_2PI).sum(-1)
    entropy = (0.5 + LOG_SQRT_2PI + log_std).sum(-1).expand(mean.shape[:-1])
    return action, logprob, entropy
