"""What a network sees of an observation, as features: a flat state as it is (`StateEncoder`), or camera
images through a small CNN with proprioception joined after it (`PixelEncoder`). Each reads its inputs
from a simulator's observation batch (`inputs`) and reports its feature size (`out_dim`), so a policy head
or a critic is built on either alike."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from m2flow.workers.models.host_copy import from_host
from m2flow.workers.models.inputs import VisionInputs, pixel_convs, reads_of
from m2flow.workers.models.mlp import layer_init
from m2flow.workers.models.vision import image_planes, read_observation


class StateEncoder(nn.Module):
    """A flat state observation (`obs` of GymEnv's batch), as floats."""

    def __init__(self, obs_dim: int):
        super().__init__()
        self.out_dim = obs_dim

    def inputs(self, batch: Any, device: torch.device) -> torch.Tensor:
        obs = batch["obs"] if isinstance(batch, dict) else batch
        return from_host(obs, device, np.float32)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return obs


class PixelEncoder(nn.Module):
    """Camera images (uint8, scaled on the device) through the convolutions and a ReLU projection to
    `hidden`; proprioception, if the policy reads it, joined after: `out_dim` = hidden + its size."""

    def __init__(self, inputs: VisionInputs, hidden: int):
        super().__init__()
        self.cameras = inputs.cameras
        self.reads = reads_of(inputs.modalities, inputs.proprio_dim)
        layers: list[nn.Module] = []
        convs, flat = pixel_convs(inputs)
        for c_in, c_out, kernel, stride in convs:
            layers += [layer_init(nn.Conv2d(c_in, c_out, kernel, stride=stride)), nn.ReLU()]
        self.encoder = nn.Sequential(*layers, nn.Flatten())
        self.project = nn.Sequential(layer_init(nn.Linear(flat, hidden)), nn.ReLU())
        self.out_dim = hidden + inputs.proprio_dim

    def inputs(self, batch: dict[str, np.ndarray], device: torch.device) -> dict[str, torch.Tensor]:
        return read_observation(batch, self.reads, self.cameras, device)

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        x = self.project(self.encoder(image_planes(obs)))
        return torch.cat([x, obs["proprio"].float()], dim=-1) if "proprio" in obs else x
