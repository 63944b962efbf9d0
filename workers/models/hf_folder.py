"""What a `model: hf` folder says without loading it: its config.json, the tensor shapes in its safetensors
headers, its tokenizer.json (read by `tokenizers`, which needs no torch). A dry run (`m2flow validate` /
`plan`) sizes the policy from these and imports neither torch nor transformers. Where the folder does not hold
what is needed (no safetensors, a config that leaves a size to its class's defaults, no tokenizer.json, the
folder's own model code), each function returns None and the caller asks transformers instead."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from m2flow.workers.models.activations import Stack
from m2flow.workers.models.hf_options import HEADS_WEIGHTS, HFOptions, prompt, read_config, transformers
from m2flow.workers.models.inputs import VisionInputs

DTYPE_BYTES = {"fp32": 4, "bf16": 2}
ADAPTER_BYTES = 4  # peft keeps LoRA adapters in fp32 beside a bf16 backbone (autocast_adapter_dtype)
HEADS_BYTES = 4  # the action and value heads are built in fp32


@dataclass(frozen=True)
class FolderSize:
    """An hf policy's state, counted from its folder."""

    bytes: int
    trainable: int
    trainable_bytes: int


def tensor_shapes(folder: str | Path) -> dict[str, list[int]] | None:
    """Each backbone tensor's shape, from the safetensors files' headers; None if the folder has none."""
    files = sorted(p for p in Path(folder).glob("*.safetensors") if p.name != HEADS_WEIGHTS)
    if not files:
        return None
    shapes = {}
    for path in files:
        with path.open("rb") as file:
            header = json.loads(file.read(int.from_bytes(file.read(8), "little")))
        shapes.update({name: entry["shape"] for name, entry in header.items() if name != "__metadata__"})
    return shapes


def folder_size(options: HFOptions, inputs: VisionInputs) -> FolderSize | None:
    """The policy's state as `HFPolicy` builds it: the backbone in `options.dtype`, LoRA's adapters on the
    linear layers `target_modules` names, the fp32 heads on the decoder's last hidden state (+ proprio)."""
    config = read_config(options.path)
    shapes = tensor_shapes(options.path)
    width = config.get("text_config", {}).get("hidden_size")
    if shapes is None or width is None or "auto_map" in config:
        return None
    backbone = sum(math.prod(shape) for shape in shapes.values())
    width += inputs.proprio_dim
    heads = width + 1  # the value head
    if options.head == "gaussian":
        heads += width * inputs.act_dim + inputs.act_dim + inputs.act_dim  # the mean's layer and the log-std
    buffers = (options.action_bins + 6) * 4  # the bins and the image normalisation, fp32
    state = backbone * DTYPE_BYTES[options.dtype] + heads * HEADS_BYTES + buffers
    if options.lora is None:
        return FolderSize(state, backbone + heads, backbone * DTYPE_BYTES[options.dtype] + heads * HEADS_BYTES)
    adapters = sum(
        options.lora.r * sum(shape)
        for name, shape in shapes.items()
        if len(shape) == 2
        and name.endswith(".weight")
        and name[: -len(".weight")].rsplit(".", 1)[-1] in options.lora.target_modules
    )
    trainable_bytes = adapters * ADAPTER_BYTES + heads * HEADS_BYTES
    return FolderSize(state + adapters * ADAPTER_BYTES, adapters + heads, trainable_bytes)


def hf_stacks(options: HFOptions, act_dim: int) -> list[Stack]:
    """The vision tower's and the decoder's layers over one sample's tokens: the image's patches (+ a class
    token in the tower); in the decoder the prompt as the policy builds it, the image's tokens in place of its
    placeholder, and the tokens head's action positions. From config.json and tokenizer.json where they hold
    it, else from transformers' config (with its defaults) and tokenizer."""
    config, ids = _read_prompt(options) or _load_prompt(options)
    vision, text = config["vision_config"], config["text_config"]
    image = config["image_token_index"]
    patches = (vision["image_size"] // vision["patch_size"]) ** 2
    image_tokens = patches + (config.get("vision_feature_select_strategy", "default") == "full")
    actions = act_dim if options.head == "tokens" else 0
    decoder_tokens = len(ids) - ids.count(image) + image_tokens + actions
    heads = text["num_attention_heads"]
    kv = text.get("num_key_value_heads") or heads
    return [
        Stack(vision["num_hidden_layers"], patches + 1, vision["hidden_size"], vision["intermediate_size"],
              vision["hidden_size"]),
        Stack(
            text["num_hidden_layers"],
            decoder_tokens,
            text["hidden_size"],
            text["intermediate_size"],
            text["hidden_size"] * kv // heads,
            style="llama" if text["hidden_act"] == "silu" else "vit",  # SwiGLU decoders: LLaMA-style
        ),
    ]  # fmt: skip


VISION_KEYS = ("image_size", "patch_size", "hidden_size", "intermediate_size", "num_hidden_layers")
TEXT_KEYS = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "hidden_act")


def _read_prompt(options: HFOptions) -> tuple[dict[str, Any], list[int]] | None:
    """config.json and the prompt's token ids from tokenizer.json, if they hold every size `hf_stacks` reads."""
    folder = Path(options.path)
    config = read_config(folder)
    vision, text = config.get("vision_config", {}), config.get("text_config", {})
    complete = all(k in vision for k in VISION_KEYS) and all(k in text for k in TEXT_KEYS)
    if "auto_map" in config or not complete or "image_token_index" not in config:
        return None
    if not (folder / "tokenizer.json").exists():
        return None
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    placeholder = tokenizer.id_to_token(config["image_token_index"])
    return config, tokenizer.encode(prompt(placeholder, options.instruction)).ids


def _load_prompt(options: HFOptions) -> tuple[dict[str, Any], list[int]]:
    """The same through transformers: the config with its class's defaults, and its tokenizer."""
    lib = transformers()
    remote = options.trust_remote_code
    config = lib.AutoConfig.from_pretrained(options.path, trust_remote_code=remote)
    tokenizer = lib.AutoTokenizer.from_pretrained(options.path, trust_remote_code=remote)
    placeholder = tokenizer.convert_ids_to_tokens(config.image_token_index)
    return config.to_dict(), tokenizer(prompt(placeholder, options.instruction))["input_ids"]
