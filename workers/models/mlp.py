"""The Gaussian MLP actor-critic of CleanRL's `ppo_continuous_action.py`, plus observation normalisation.

The normaliser's running statistics are module buffers, so they travel with the weights from the
training worker to the inference worker and into checkpoints.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn
from torch.distributions.normal import Normal

from m2flow.workers.algorithms.moments import Combine, merge


class PolicyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    obs_dim: int = Field(ge=1)
    act_dim: int = Field(ge=1)
    hidden: list[int] = Field(default_factory=lambda: [64, 64])
    normalize_obs: bool = True


def layer_init(layer: nn.Module, std: float = math.sqrt(2), bias: float = 0.0) -> nn.Module:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(sizes: list[int], out: int, out_std: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(sizes, sizes[1:], strict=False):
        layers += [layer_init(nn.Linear(a, b)), nn.Tanh()]
    layers.append(layer_init(nn.Linear(sizes[-1], out), std=out_std))
    return nn.Sequential(*layers)


class RunningNorm(nn.Module):
    """Running mean/variance of observations (parallel-variance update), clipped to +-clip."""

    def __init__(self, dim: int, clip: float = 10.0, epsilon: float = 1e-8):
        super().__init__()
        self.clip, self.epsilon = clip, epsilon
        self.register_buffer("mean", torch.zeros(dim, dtype=torch.float64))
        self.register_buffer("var", torch.ones(dim, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: torch.Tensor, combine: Combine | None = None) -> None:
        """Fold in a batch of observations; `combine` merges its moments with other ranks' parts of it."""
        x = x.reshape(-1, x.shape[-1]).to(torch.float64)
        batch = (x.mean(0), x.var(0, unbiased=False), x.shape[0])
        if combine is not None:
            batch = combine(*batch)
        mean, var, count = merge(self.mean, self.var, self.count, batch)
        self.mean.copy_(mean)
        self.var.copy_(var)
        self.count.copy_(count)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = (x - self.mean.to(x.dtype)) / torch.sqrt(self.var.to(x.dtype) + self.epsilon)
        return normed.clamp(-self.clip, self.clip)


class GaussianMLP(nn.Module):
    """For state observations: `{"obs": [n, d]}` (as GymEnv sends) or the array itself."""

    def __init__(self, config: PolicyConfig):
        super().__init__()
        self.act_dim = config.act_dim
        sizes = [config.obs_dim, *config.hidden]
        self.obs_norm = RunningNorm(config.obs_dim) if config.normalize_obs else nn.Identity()
        self.critic = mlp(sizes, 1, out_std=1.0)
        self.actor_mean = mlp(sizes, config.act_dim, out_std=0.01)
        self.actor_logstd = nn.Parameter(torch.zeros(1, config.act_dim))

    def inputs(self, batch, device: torch.device) -> torch.Tensor:
        obs = batch["obs"] if isinstance(batch, dict) else batch
        return torch.tensor(obs, dtype=torch.float32, device=device)

    def update_normalizer(self, obs: torch.Tensor, combine: Combine | None = None) -> None:
        if isinstance(self.obs_norm, RunningNorm):
            self.obs_norm.update(obs, combine)

    def mean_action(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor_mean(self.obs_norm(obs))

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        return self(obs, value_only=True)

    def get_action_and_value(
        self, obs: torch.Tensor, action: torch.Tensor | None = None, noise: torch.Tensor | None = None
    ):
        """(action, log-prob, entropy, value); a new action is mean + std * noise (standard normal)."""
        return self(obs, action, noise)

    def forward(
        self,
        obs: torch.Tensor,
        action: torch.Tensor | None = None,
        noise: torch.Tensor | None = None,
        value_only: bool = False,
    ):
        """Every use goes through `forward`, so FSDP2 gathers the root's parameters before it."""
        x = self.obs_norm(obs)
        if value_only:
            return self._value(x)
        mean = self.actor_mean(x)
        std = self.actor_logstd.expand_as(mean).exp()
        dist = Normal(mean, std)
        if action is None:
            action = mean + std * (torch.randn_like(mean) if noise is None else noise)
        return action, dist.log_prob(action).sum(-1), dist.entropy().sum(-1), self._value(x)

    def _value(self, x: torch.Tensor) -> torch.Tensor:
        """A fresh tensor, not a view: FSDP2's backward hook must not see in-place edits of a view."""
        return self.critic(x).squeeze(-1).clone()


def env_dims(env_id: str, **env_kwargs) -> tuple[int, int]:
    """Observation and action sizes of a gymnasium env, read from a throwaway instance."""
    from m2flow.workers.env.env_ids import make_env

    env = make_env(env_id, **env_kwargs)
    try:
        return int(np.prod(env.observation_space.shape)), int(np.prod(env.action_space.shape))
    finally:
        env.close()


def state_checksum(state: dict[str, torch.Tensor]) -> float:
    """A position-weighted sum over every tensor: a copy cut short or reordered does not match."""
    total = 0.0
    for i, key in enumerate(sorted(state)):
        flat = state[key].detach().reshape(-1).double().cpu()
        weights = torch.arange(1, flat.numel() + 1, dtype=torch.float64)
        total += (i + 1) * float((flat * weights).sum())
    return total
