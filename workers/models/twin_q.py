"""SAC's critic: twin Q-networks on the features of one observation encoder."""

from __future__ import annotations

import torch
from torch import nn

from m2flow.workers.models.squashed import Observation, relu_mlp


class TwinQ(nn.Module):
    """The twin Q-networks on the features of one observation encoder (for a state, the state itself: two
    independent MLPs as CleanRL's; for camera images, one CNN that the critic loss trains and the policy
    reads, as DrQ shares it)."""

    def __init__(self, encoder: nn.Module, act_dim: int, hidden: list[int]):
        super().__init__()
        self.encoder = encoder
        self.q1 = relu_mlp([encoder.out_dim + act_dim, *hidden], 1)
        self.q2 = relu_mlp([encoder.out_dim + act_dim, *hidden], 1)

    def forward(
        self, obs: Observation, action: torch.Tensor, detach_encoder: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.encoder(obs)
        x = torch.cat([features.detach() if detach_encoder else features, action], dim=-1)
        return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)
