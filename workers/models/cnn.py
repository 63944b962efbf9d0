"""A vision policy: a small CNN over the camera images (Nature-CNN sized for 64-128 px), joined with
proprioception, then Gaussian action-chunk and value heads. Images travel as uint8 and become floats
on the model's device."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.distributions.normal import Normal

from m2flow.workers.models.mlp import layer_init

IMAGE_CHANNELS = {"rgb": 3, "depth": 1, "segmentation": 1}
CONVS = [(8, 4, 32), (4, 2, 64), (3, 1, 64)]  # kernel, stride, output channels
DEPTH_SCALE_M = 10.0


class CNNPolicy(nn.Module):
    def __init__(
        self,
        modalities: list[str],
        cameras: int,
        size: tuple[int, int],
        proprio_dim: int,
        act_dim: int,
        hidden: int = 256,
    ):
        super().__init__()
        self.act_dim, self.cameras = act_dim, cameras
        self.reads = [m for m in modalities if m in IMAGE_CHANNELS] + (["proprio"] if proprio_dim else [])
        channels = image_channels(modalities, cameras)
        layers: list[nn.Module] = []
        h, w, c_in = *size, channels
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

    def inputs(self, batch: dict[str, np.ndarray], device: torch.device) -> dict[str, torch.Tensor]:
        return observation_inputs(self.reads, self.cameras, batch, device)

    def _features(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        x = self.project(self.encoder(image_planes(obs)))
        return torch.cat([x, obs["proprio"].float()], dim=-1) if "proprio" in obs else x

    def update_normalizer(self, obs: dict[str, torch.Tensor]) -> None:
        """Images are scaled by construction; nothing runs here."""

    def mean_action(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.actor_mean(self._features(obs))

    def get_value(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self(obs, value_only=True)

    def get_action_and_value(self, obs, action=None, noise=None):
        return self(obs, action, noise)

    def forward(
        self,
        obs: dict[str, torch.Tensor],
        action: torch.Tensor | None = None,
        noise: torch.Tensor | None = None,
        value_only: bool = False,
    ):
        x = self._features(obs)
        if value_only:
            return self.critic(x).squeeze(-1).clone()
        mean = self.actor_mean(x)
        std = self.actor_logstd.expand_as(mean).exp()
        dist = Normal(mean, std)
        if action is None:
            action = mean + std * (torch.randn_like(mean) if noise is None else noise)
        return action, dist.log_prob(action).sum(-1), dist.entropy().sum(-1), self.critic(x).squeeze(-1).clone()


def observation_inputs(
    reads: list[str], cameras: int, batch: dict[str, np.ndarray], device: torch.device
) -> dict[str, torch.Tensor]:
    """What a vision policy reads of an observation: its modalities, of its cameras (the first ones the
    simulator renders); anything else the simulator sent is ignored."""
    missing = [m for m in reads if m not in batch]
    if missing:
        raise KeyError(f"the policy reads {missing} but the observation has only {sorted(batch)}")
    return {
        m: torch.tensor(np.asarray(batch[m] if m == "proprio" else batch[m][:, :cameras]), device=device) for m in reads
    }


def image_planes(obs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Every camera's image modalities stacked as channels, scaled to about [0, 1]: [n, channels, h, w]."""
    planes = []
    if "rgb" in obs:  # [n, cams, h, w, 3] uint8 -> [n, cams*3, h, w]
        rgb = obs["rgb"].permute(0, 1, 4, 2, 3)
        planes.append(rgb.reshape(rgb.shape[0], -1, *rgb.shape[3:]).float() / 255.0)
    if "depth" in obs:
        planes.append(obs["depth"].float().clamp(0, DEPTH_SCALE_M) / DEPTH_SCALE_M)
    if "segmentation" in obs:
        planes.append(obs["segmentation"].float() / 100.0)
    return torch.cat(planes, dim=1)


def image_channels(modalities: list[str], cameras: int) -> int:
    return cameras * sum(IMAGE_CHANNELS.get(m, 0) for m in modalities)
