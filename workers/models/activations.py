"""The memory a policy's training forward keeps for its backward, from the config alone (the planner's
estimate: nothing is built or loaded).

Transformer stacks dominate it. Per token, a layer of width h, MLP width i and key/value width kv keeps
for backward (counted from what real forwards save; the tests compare):
- `vit` (pre-LayerNorm, GELU MLP; CLIP towers too): 7h + 2kv + 2i values: both norms' inputs and outputs,
  q, k and v, the attention's output and the projection's input, the MLP's activation before and after
  GELU. Under bf16 autocast the two residual-stream inputs stay fp32 and the rest is bf16.
- `llama` (RMSNorm, rotary embeddings, grouped-query attention, SwiGLU MLP): 11h + 4kv + 4i: as above,
  plus q and k before and after rotation, k and v repeated to every head, and the MLP's gate, up
  projection, activation and product. Under bf16 autocast the norms compute in fp32 (5h values) and the
  bf16 casts of their outputs are kept as well (12h + 4kv + 4i).
With activation checkpointing a layer keeps only its input (the fp32 residual stream) and recomputes the
rest in backward, one layer at a time. MLP and CNN policies keep a few vectors per sample: not counted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

Count = Callable[[int, int, int], int]  # (hidden, kv, intermediate) -> values per token


@dataclass(frozen=True)
class LayerStyle:
    fp32: Count  # computing in fp32: every kept value 4 bytes
    bf16: Count  # under bf16 autocast: the values kept in bf16...
    fp32_under_bf16: Count  # ...and those autocast keeps in fp32

    def token_bytes(self, hidden: int, kv: int, intermediate: int, bf16: bool) -> int:
        if bf16:
            return 2 * self.bf16(hidden, kv, intermediate) + 4 * self.fp32_under_bf16(hidden, kv, intermediate)
        return 4 * self.fp32(hidden, kv, intermediate)


STYLES = {
    "vit": LayerStyle(
        fp32=lambda h, kv, i: 7 * h + 2 * kv + 2 * i,
        bf16=lambda h, kv, i: 5 * h + 2 * kv + 2 * i,
        fp32_under_bf16=lambda h, kv, i: 2 * h,
    ),
    "llama": LayerStyle(
        fp32=lambda h, kv, i: 11 * h + 4 * kv + 4 * i,
        bf16=lambda h, kv, i: 12 * h + 4 * kv + 4 * i,
        fp32_under_bf16=lambda h, kv, i: 5 * h,
    ),
}


@dataclass(frozen=True)
class Stack:
    """`layers` transformer layers of `style` over `tokens` tokens per sample, `hidden` wide, MLP
    `intermediate` wide, keys and values `kv` wide."""

    layers: int
    tokens: int
    hidden: int
    intermediate: int
    kv: int
    style: Literal["vit", "llama"] = "vit"

    def bytes_per_sample(self, checkpointing: bool, bf16: bool) -> int:
        """Bytes one sample keeps for backward: every layer's, or with checkpointing each layer's input
        plus one layer's being recomputed."""
        layer = self.tokens * STYLES[self.style].token_bytes(self.hidden, self.kv, self.intermediate, bf16)
        if checkpointing:
            return self.layers * self.tokens * self.hidden * 4 + layer
        return self.layers * layer


def activation_bytes(stacks: list[Stack], samples: int, checkpointing: bool, bf16: bool) -> int:
    """Bytes a forward over `samples` keeps for backward (computing in fp32, or under bf16 autocast)."""
    return samples * sum(stack.bytes_per_sample(checkpointing, bf16) for stack in stacks)
