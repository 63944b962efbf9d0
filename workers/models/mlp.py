"""The Gaussian MLP actor-critic of CleanRL's `ppo_continuous_action.py`: separate actor and critic MLPs,
orthogonal initialisation (std sqrt(2), 0.01 for the actor's output, 1 for the critic's), a
state-independent log-std. Activation, initial log-std and the initialisation are options (rl-zoo's tuned
MuJoCo settings use ReLU, log-std -2 and PyTorch's default initialisation). Observations arrive
normalised by the simulator (`GymEnv.normalize_obs`), as CleanRL's env wrappers normalise them.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import torch
from pydantic import ConfigDict, Field
from torch import nn

from m2flow.strict_numbers import NumbersNotBooleans
from m2flow.workers.models.gaussian import gaussian_head
from m2flow.workers.models.host_copy import from_host

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}


class PolicyConfig(NumbersNotBooleans):
    model_config = ConfigDict(extra="forbid")

    obs_dim: int = Field(ge=1)
    act_dim: int = Field(ge=1)
    hidden: list[int] = Field(default_factory=lambda: [64, 64])
    activation: Literal["tanh", "relu"] = "tanh"
    log_std_init: float = 0.0
    ortho_init: bool = True


def layer_init(layer: nn.Module, std: float = math.sqrt(2), bias: float = 0.0) -> nn.Module:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(sizes: list[int], out: int, out_std: float, activation: str = "tanh", ortho_init: bool = True) -> nn.Sequential:
    init = layer_init if ortho_init else (lambda layer, std=None: layer)
    layers: list[nn.Module] = []
    for a, b in zip(sizes, sizes[1:], strict=False):
        layers += [init(nn.Linear(a, b)), ACTIVATIONS[activation]()]
    layers.append(init(nn.Linear(sizes[-1], out), std=out_std))
    return nn.Sequential(*layers)


class GaussianMLP(nn.Module):
    """For state observations: `{"obs": [n, d]}` (as GymEnv sends) or the array itself."""

    def __init__(self, config: PolicyConfig):
        super().__init__()
        self.act_dim = config.act_dim
        sizes = [config.obs_dim, *config.hidden]
        options = {"activation": config.activation, "ortho_init": config.ortho_init}
        self.critic = mlp(sizes, 1, out_std=1.0, **options)
        self.actor_mean = mlp(sizes, config.act_dim, out_std=0.01, **options)
        self.actor_logstd = nn.Parameter(torch.full((1, config.act_dim), config.log_std_init))

    def inputs(self, batch, device: torch.device) -> torch.Tensor:
        obs = batch["obs"] if isinstance(batch, dict) else batch
        return from_host(obs, device, np.float32)

    def mean_action(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor_mean(obs)

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
        x = obs
        if value_only:
            return self._value(x)
        action, logprob, entropy = gaussian_head(self.actor_mean(x), self.actor_logstd, action, noise)
        return action, logprob, entropy, self._value(x)

    def _value(self, x: torch.Tensor) -> torch.Tensor:
        """A fresh tensor, not a view: FSDP2's backward hook must not see in-place edits of a view."""
        return self.critic(x).squeeze(-1).clone()
