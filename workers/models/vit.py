"""A vision-transformer policy: camera images cut into patches, a proprioception token and a readout
token, a stack of pre-LayerNorm transformer blocks, then Gaussian action-chunk and value heads on the
readout token (the last one, so a causal trunk, as Megatron's GPTModel runs it, also sees everything).

Sizes are named by their parameter count (`VIT_SIZES`, ~1M to ~300M); `width`/`depth`/`heads` override
a preset. Each block can recompute its activations in backward (`activation_checkpointing`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from m2flow.workers.models.inputs import VisionInputs, image_channels
from m2flow.workers.models.mlp import layer_init
from m2flow.workers.models.vision import VisionActorCritic, image_planes
from m2flow.workers.models.vit_presets import check_vit, vit_tokens


class Block(nn.Module):
    """x + attention(LN(x)), then x + MLP(LN(x)); the attention's q, k, v come from one fused linear."""

    def __init__(self, width: int, heads: int, causal: bool):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc1, self.fc2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, tokens, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(n, tokens, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        x = x + self.proj(attended.transpose(1, 2).reshape(n, tokens, width))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class ViTPolicy(VisionActorCritic):
    def __init__(self, inputs: VisionInputs, width: int, depth: int, heads: int, patch: int = 8, causal: bool = False):
        super().__init__(inputs)
        size, proprio_dim, act_dim = inputs.size, inputs.proprio_dim, inputs.act_dim
        check_vit(width, heads, size, patch)
        self.activation_checkpointing = False
        self.patchify = nn.Conv2d(image_channels(inputs.modalities, inputs.cameras), width, patch, stride=patch)
        tokens = vit_tokens(inputs, patch)
        self.proprio = nn.Linear(proprio_dim, width) if proprio_dim else None
        self.readout = nn.Parameter(torch.zeros(1, 1, width))
        self.position = nn.Parameter(torch.randn(1, tokens, width) * 0.02)
        self.blocks = nn.ModuleList(Block(width, heads, causal) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.actor_mean = layer_init(nn.Linear(width, act_dim), std=0.01)
        self.critic = layer_init(nn.Linear(width, 1), std=1.0)
        self.actor_logstd = nn.Parameter(torch.full((1, act_dim), -0.5))

    def tokens(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """[n, tokens, width]: image patches, then proprioception, then the readout token."""
        patches = self.patchify(image_planes(obs)).flatten(2).transpose(1, 2)
        parts = [patches]
        if self.proprio is not None:
            parts.append(self.proprio(obs["proprio"].float()).unsqueeze(1))
        parts.append(self.readout.expand(patches.shape[0], -1, -1))
        return torch.cat(parts, dim=1) + self.position

    def trunk(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            if self.activation_checkpointing and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return x

    def _features(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.norm(self.trunk(self.tokens(obs))[:, -1]).float()
