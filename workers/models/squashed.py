"""SAC's actor: a state-dependent Gaussian squashed by tanh into the action bounds (CleanRL's
`sac_continuous_action.py` Actor: ReLU trunk, mean and log-std heads, log-std squashed into [-5, 2]), on the
features of a state or of camera images."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from m2flow.workers.models.gaussian import LOG_SQRT_2PI
from m2flow.workers.models.mlp import mlp

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
Observation = torch.Tensor | dict[str, torch.Tensor]  # a state, or camera modalities (an encoder's inputs)


def relu_mlp(sizes: list[int], out: int) -> nn.Sequential:
    """ReLU layers of `sizes`, then a linear output of `out`, PyTorch's default initialisation (CleanRL's SAC)."""
    return mlp(sizes, out, out_std=1.0, activation="relu", ortho_init=False)


class SquashedGaussian(nn.Module):
    """The inference worker's interface (`inputs`, `mean_action`, `get_action_and_value`) for SAC's policy:
    the observation's features (`encoders`: a state as it is, or camera images through a CNN), a ReLU
    trunk, mean and log-std heads. It has no critic (SAC's Q-networks live in the training worker): the
    value it reports is 0."""

    def __init__(self, encoder: nn.Module, act_dim: int, hidden: list[int], low: torch.Tensor, high: torch.Tensor):
        super().__init__()
        self.act_dim = act_dim
        self.encoder = encoder
        self.detach_encoder = False  # SAC: the critic's loss trains a shared encoder, the policy's does not
        self.trunk = relu_mlp([encoder.out_dim, *hidden[:-1]], hidden[-1])
        self.mean = nn.Linear(hidden[-1], act_dim)
        self.log_std = nn.Linear(hidden[-1], act_dim)
        self.register_buffer("action_scale", ((high - low) / 2).float())
        self.register_buffer("action_bias", ((high + low) / 2).float())

    def inputs(self, batch: Any, device: torch.device) -> Observation:
        return self.encoder.inputs(batch, device)

    def mean_action(self, obs: Observation) -> torch.Tensor:
        mean, _ = self._head(obs)
        return torch.tanh(mean) * self.action_scale + self.action_bias

    def sample(self, obs: Observation, noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """A squashed action and its log-probability (with tanh's change of variables), reparameterised."""
        mean, log_std = self._head(obs)
        std = log_std.exp()
        eps = torch.randn_like(mean) if noise is None else noise
        squashed = torch.tanh(mean + std * eps)
        logprob = (-0.5 * eps.square() - log_std - LOG_SQRT_2PI).sum(-1)
        logprob = logprob - torch.log(self.action_scale * (1 - squashed.square()) + 1e-6).sum(-1)
        return squashed * self.action_scale + self.action_bias, logprob

    def get_action_and_value(
        self, obs: Observation, action: torch.Tensor | None = None, noise: torch.Tensor | None = None
    ):
        """(action, log-prob, entropy, value) as the inference worker reads them: a new action only."""
        if action is not None:
            raise ValueError("SAC's policy acts; it does not re-score given actions (PPO's update does)")
        action, logprob = self.sample(obs, noise)
        zeros = logprob.new_zeros(logprob.shape)
        return action, logprob, zeros, zeros

    def _head(self, obs: Observation) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.encoder(obs)
        h = torch.relu(self.trunk(features.detach() if self.detach_encoder else features))
        log_std = torch.tanh(self.log_std(h))
        return self.mean(h), LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)
