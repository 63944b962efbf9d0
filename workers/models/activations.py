"""The memory a policy's training forward keeps for its backward, from the config alone (the planner's
estimate: nothing is built or loaded).

Transformer stacks dominate it. Per token, a layer of `hidden` h, MLP width i and key/value width kv keeps
for backward (counted from what a real forward saves; the tests compare):
- `vit` (pre-LayerNorm, GELU MLP; CLIP towers too): 7h + 2kv + 2i: both norms' inputs and outputs, q, k, v,
  the attention's output and the projection's input, the MLP's inner activation before and after GELU;
- `llama` (RMSNorm, rotary embeddings, grouped-query attention, SwiGLU MLP): 11h + 4kv + 4i: as above,
  plus q and k before and after rotation, k and v repeated to every head, and the MLP's gate, up
  projection, activation and product. With activation checkpointing a layer keeps only its input and recomputes the
rest in backward, one layer at a time. MLP and CNN policies keep a few vectors per sample: not counted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

# values one token keeps for backward in one layer, by layer style: f(hidden, kv, intermediate)
LAYER_VALUES: dict[str, Callable[[int, int, int], int]] = {
    "vit": lambda h, kv, i: 7 * h + 2 * kv + 2 * i,
    "llama": lambda h, kv, i: 11 * h + 4 * kv + 4 * i,
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

    def values_per_sample(self, checkpointing: bool) -> int:
        """Values one sample keeps for backward: every layer's, or with checkpointing each layer's input
        plus one layer's being recomputed."""
        layer = self.tokens * LAYER_VALUES[self.style](self.hidden, self.kv, self.intermediate)
        if checkpointing:
            return self.layers * self.tokens * self.hidden + layer
        return self.layers * layer


def activation_bytes(stacks: list[Stack], samples: int, checkpointing: bool, value_bytes: int) -> int:
    """Bytes a forward over `samples` keeps for backward, its values `value_bytes` each (2 under bf16)."""
    return samples * value_bytes * sum(stack.values_per_sample(checkpointing) for stack in stacks)
