"""A vision policy: a small CNN over the camera images (Nature-CNN sized for 64-128 px) projected to
`hidden[0]`, joined with proprioception, then Gaussian action-chunk and value heads of `hidden` layers (SB3's
`MultiInputPolicy` shape: its CombinedExtractor, then `net_arch`). Images travel as uint8 and become floats on
the model's device."""

from __future__ import annotations

import torch
from torch import nn

from m2flow.workers.models.encoders import PixelEncoder
from m2flow.workers.models.inputs import VisionInputs
from m2flow.workers.models.mlp import mlp
from m2flow.workers.models.vision import VisionActorCritic


class CNNPolicy(VisionActorCritic):
    def __init__(
        self,
        inputs: VisionInputs,
        hidden: list[int],
        activation: str = "tanh",
        log_std_init: float = -0.5,
        ortho_init: bool = True,
    ):
        """`ortho_init` initialises the heads (the pixel encoder is always orthogonally initialised)."""
        super().__init__(inputs)
        self.pixels = PixelEncoder(inputs, hidden[0])
        sizes, options = [self.pixels.out_dim, *hidden], {"activation": activation, "ortho_init": ortho_init}
        self.actor_mean = mlp(sizes, inputs.act_dim, out_std=0.01, **options)
        self.critic = mlp(sizes, 1, out_std=1.0, **options)
        self.actor_logstd = nn.Parameter(torch.full((1, inputs.act_dim), log_std_init))

    def _features(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.pixels(obs)
