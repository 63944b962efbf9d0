"""What every camera policy shares: reading the observation (its modalities, of its cameras), turning
images into scaled float planes on the device, and the Gaussian action-chunk and value heads on top of
the features a subclass computes (`_features`)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from m2flow.workers.models.gaussian import gaussian_head
from m2flow.workers.models.host_copy import from_host
from m2flow.workers.models.inputs import DEPTH_SCALE_M, VisionInputs, reads_of


class VisionActorCritic(nn.Module):
    """Subclasses set the `actor_mean`, `critic`, `actor_logstd` heads and compute `_features(obs) ->
    [n, features]`. Every use goes through `forward`, so FSDP2 gathers the root's parameters before it."""

    reads: list[str]
    cameras: int

    def __init__(self, inputs: VisionInputs | None = None):
        super().__init__()
        if inputs is not None:
            self.act_dim, self.cameras, self.proprio_dim = inputs.act_dim, inputs.cameras, inputs.proprio_dim
            self.reads = reads_of(inputs.modalities, inputs.proprio_dim)

    def _features(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def inputs(self, batch: dict[str, np.ndarray], device: torch.device) -> dict[str, torch.Tensor]:
        """What the policy reads of an observation: its modalities, of its cameras (the first ones the
        simulator renders); anything else the simulator sent is ignored."""
        return read_observation(batch, self.reads, self.cameras, device)

    def mean_action(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.actor_mean(self._features(obs))

    def get_value(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self(obs, value_only=True)

    def get_action_and_value(self, obs, action=None, noise=None):
        """(action, log-prob, entropy, value); a new action is mean + std * noise (standard normal)."""
        return self(obs, action, noise)

    def forward(
        self,
        obs: dict[str, torch.Tensor],
        action: torch.Tensor | None = None,
        noise: torch.Tensor | None = None,
        value_only: bool = False,
    ):
        x = self._features(obs)
        value = self.critic(x).squeeze(-1).float().clone()  # a fresh fp32 tensor, also under autocast
        if value_only:
            return value
        action, logprob, entropy = gaussian_head(self.actor_mean(x), self.actor_logstd, action, noise)
        return action, logprob, entropy, value


def read_observation(
    batch: dict[str, np.ndarray], reads: list[str], cameras: int, device: torch.device
) -> dict[str, torch.Tensor]:
    """The keys a policy reads of an observation batch, of its first `cameras` cameras, on `device`."""
    missing = [m for m in reads if m not in batch]
    if missing:
        raise KeyError(f"the policy reads {missing} but the observation has only {sorted(batch)}")
    return {m: from_host(batch[m] if m == "proprio" else batch[m][:, :cameras], device) for m in reads}


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
