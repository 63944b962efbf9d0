"""A vision policy: a small CNN over the camera images (Nature-CNN sized for 64-128 px), joined with
proprioception, then Gaussian action-chunk and value heads. Images travel as uint8 and become floats
on the model's device."""

from __future__ import annotations

import torch
from torch import nn

from m2flow.workers.models.mlp import layer_init
from m2flow.workers.models.vision import VisionActorCritic, VisionInputs, image_channels, image_planes

CONVS = [(8, 4, 32), (4, 2, 64), (3, 1, 64)]  # kernel, stride, output channels


class CNNPolicy(VisionActorCritic):
    def __init__(self, inputs: VisionInputs, hidden: int = 256):
        super().__init__(inputs)
        size, proprio_dim, act_dim = inputs.size, inputs.proprio_dim, inputs.act_dim
        layers: list[nn.Module] = []
        h, w, c_in = *size, image_channels(inputs.modalities, inputs.cameras)
        for kernel, stride, c_out in CONVS:
            layers += [layer_init(nn.Conv2d(c_in, c_out, kernel, stride=stride)), nn.ReLU()]
            h, w, c_in = (h - kernel) // stride + 1, (w - kernel) // stride + 1, c_out
        self.encoder = nn.Sequential(*layers, nn.Flatten())
        if h < 1 or w < 1:
            raise ValueError(f"images of {size} are too small for the encoder; use at least 36x36")
        flat = 64 * h * w
        self.project = nn.Sequential(layer_init(nn.Linear(flat, hidden)), nn.ReLU())
        trunk = hidden + proprio_dim
        self.actor_mean = nn.Sequential(
            layer_init(nn.Linear(trunk, hidden)), nn.Tanh(), layer_init(nn.Linear(hidden, act_dim), std=0.01)
        )
        self.critic = nn.Sequential(
            layer_init(nn.Linear(trunk, hidden)), nn.Tanh(), layer_init(nn.Linear(hidden, 1), std=1.0)
        )
        self.actor_logstd = nn.Parameter(torch.full((1, act_dim), -0.5))

    def _features(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        x = self.project(self.encoder(image_planes(obs)))
        return torch.cat([x, obs["proprio"].float()], dim=-1) if "proprio" in obs else x
