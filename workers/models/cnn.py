"""A vision policy: a small CNN over the camera images (Nature-CNN sized for 64-128 px), joined with
proprioception, then Gaussian action-chunk and value heads. Images travel as uint8 and become floats
on the model's device."""

from __future__ import annotations

import torch
from torch import nn

from m2flow.workers.models.encoders import PixelEncoder
from m2flow.workers.models.inputs import VisionInputs
from m2flow.workers.models.mlp import layer_init
from m2flow.workers.models.vision import VisionActorCritic


class CNNPolicy(VisionActorCritic):
    def __init__(self, inputs: VisionInputs, hidden: int = 256):
        super().__init__(inputs)
        self.pixels = PixelEncoder(inputs, hidden)
        trunk, act_dim = self.pixels.out_dim, inputs.act_dim
        self.actor_mean = nn.Sequential(
            layer_init(nn.Linear(trunk, hidden)), nn.Tanh(), layer_init(nn.Linear(hidden, act_dim), std=0.01)
        )
        self.critic = nn.Sequential(
            layer_init(nn.Linear(trunk, hidden)), nn.Tanh(), layer_init(nn.Linear(hidden, 1), std=1.0)
        )
        self.actor_logstd = nn.Parameter(torch.full((1, act_dim), -0.5))

    def _features(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.pixels(obs)
