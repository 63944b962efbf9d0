"""A ViT policy whose transformer trunk runs on megatron-core's GPTModel (CUDA), tensor-parallel over
the training worker's ranks; the tokens, final norm and heads stay the ViT policy's own modules.

GPTModel's decoder is causal, so the ViT policy must be built with `causal: true` (its readout token is
the last, and sees every other token). The layers start from the ViT policy's weights, and the state
this model hands out — weights for inference workers, checkpoints — is the ViT policy's plain layout:
TP shards gathered, and the fused q/k/v rows reordered from Megatron's per-head interleave
([head][q, k, v]) to the plain [q, k, v][head] order. Checkpoints hold whole tensors, so they reload at
any TP size and under the FSDP backend.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from m2flow.workers.models.vision import VisionActorCritic
from m2flow.workers.models.vit import ViTPolicy

# plain block name -> (GPTModel layer name, TP split dim of the weight or None, bias split too)
BLOCK_LAYOUT = {
    "norm1": ("input_layernorm", None, False),
    "qkv": ("self_attention.linear_qkv", 0, True),
    "proj": ("self_attention.linear_proj", 1, False),
    "norm2": ("pre_mlp_layernorm", None, False),
    "fc1": ("mlp.linear_fc1", 0, True),
    "fc2": ("mlp.linear_fc2", 1, False),
}


def qkv_to_megatron(tensor: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows [q; k; v] (each heads x head_dim) -> Megatron's [head][q, k, v] (a weight or a bias)."""
    rest = tensor.shape[1:]
    return tensor.reshape(3, heads, -1, *rest).transpose(0, 1).reshape(tensor.shape)


def qkv_from_megatron(tensor: torch.Tensor, heads: int) -> torch.Tensor:
    rest = tensor.shape[1:]
    return tensor.reshape(heads, 3, -1, *rest).transpose(0, 1).reshape(tensor.shape)


class GPTTrunkPolicy(VisionActorCritic):
    def __init__(self, plain: ViTPolicy, rank: int, tp: int, recompute: bool = False):
        super().__init__()
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.transformer import TransformerConfig

        if not all(block.causal for block in plain.blocks):
            raise ValueError(
                "backend: megatron runs a vit policy on GPTModel, whose attention is causal: set args.causal=true"
            )
        block = plain.blocks[0]
        width, self.heads, depth = block.qkv.in_features, block.heads, len(plain.blocks)
        self.rank, self.tp = rank, tp
        self.act_dim, self.cameras, self.reads = plain.act_dim, plain.cameras, plain.reads
        for name in ("patchify", "proprio", "readout", "position", "norm", "actor_mean", "critic", "actor_logstd"):
            setattr(self, name, getattr(plain, name))
        config = TransformerConfig(
            num_layers=depth,
            hidden_size=width,
            num_attention_heads=self.heads,
            ffn_hidden_size=4 * width,
            tensor_model_parallel_size=tp,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            layernorm_epsilon=1e-5,
            activation_func=F.gelu,
            bias_activation_fusion=False,
            masked_softmax_fusion=False,
            apply_rope_fusion=False,
            **(
                {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
                if recompute
                else {}
            ),
        )
        self.gpt = GPTModel(  # the decoder only: tokens come from the ViT's own embedding, as from an earlier stage
            config,
            get_gpt_layer_local_spec(),
            vocab_size=1,
            max_sequence_length=plain.position.shape[1],
            pre_process=False,
            post_process=False,
        ).cuda()
        self.load_blocks(plain.state_dict())

    # -- the plain layout <-> this rank's GPT layers -------------------------------------------------
    def trunk_layout(self) -> list[tuple[str, nn.Parameter, int | None, bool]]:
        """(the plain ViT's key, this rank's GPT parameter, TP split dim, is q/k/v) for every trunk tensor."""
        params = dict(self.gpt.decoder.named_parameters())
        layout = []
        for i in range(len(self.gpt.decoder.layers)):
            for plain, (megatron, dim, bias_split) in BLOCK_LAYOUT.items():
                for leaf in ("weight", "bias"):
                    split = dim if leaf == "weight" or bias_split else None
                    param = params[f"layers.{i}.{megatron}.{leaf}"]
                    layout.append((f"blocks.{i}.{plain}.{leaf}", param, split, plain == "qkv"))
        return layout

    @torch.no_grad()
    def load_blocks(self, plain: dict[str, torch.Tensor]) -> None:
        """This rank's part of each plain-layout trunk tensor, in Megatron's layout."""
        for key, param, dim, qkv in self.trunk_layout():
            full = qkv_to_megatron(plain[key], self.heads) if qkv else plain[key]
            param.copy_(full if dim is None else full.chunk(self.tp, dim=dim)[self.rank])

    tokens = ViTPolicy.tokens  # the ViT's own embedding of the observation, with its own modules

    def trunk(self, x: torch.Tensor) -> torch.Tensor:
        """GPTModel's decoder runs sequence-first: [n, tokens, width] -> [tokens, n, width] and back."""
        self.gpt.set_input_tensor(x.transpose(0, 1).contiguous())
        return self.gpt(None, None, None).transpose(0, 1)

    _features = ViTPolicy._features  # the readout token after the trunk above
