"""What a `model: hf` folder says without loading it: its config.json, the tensor shapes in its safetensors
headers, its tokenizer.json (read by `tokenizers`, which needs no torch). A dry run (`m2flow validate` /
`plan`) sizes the policy from these and imports neither torch nor transformers. Where the folder does not hold
what is needed (no safetensors, a config that leaves a size to its class's defaults, no tokenizer.json, the
folder's own model code), each function returns None and the caller asks transformers instead."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from m2flow.workers.models.activations import Stack
from m2flow.workers.models.hf_options import HFOptions, prompt, read_config, transformers
from m2flow.workers.models.inputs import VisionInputs
from m2flow.workers.models.state_size import StateSize

DTYPE_BYTES = {"fp32": 4, "bf16": 2}
ADAPTER_BYTES = 4  # peft keeps LoRA adapters in fp32 beside a bf16 backbone (autocast_adapter_dtype)
HEADS_BYTES = 4  # the action and value heads are built in fp32


def tensor_shapes(folder: str | Path) -> dict[str, list[int]] | None:
    """Each backbone tensor's shape, from the headers of the safetensors files `from_pretrained` reads (the
    index's shards, or model.safetensors); None if there are none."""
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.exists():
        files = sorted({folder / name for name in json.loads(index.read_text())["weight_map"].values()})
    else:
        files = [folder / "model.safetensors"]
    if not all(path.exists() for path in files):
        return None
    shapes = {}
    for path in files:
        with path.open("rb") as file:
            length = int.from_bytes(file.read(8), "little")
            if length > path.stat().st_size:  # a Git LFS pointer, or not a safetensors file
                raise ValueError(f"path: {path} is not a safetensors file (a Git LFS pointer not pulled?)")
            header = json.loads(file.read(length))
        shapes.update({name: entry["shape"] for name, entry in header.items() if name != "__metadata__"})
    return shapes


def folder_size(options: HFOptions, inputs: VisionInputs) -> StateSize | None:
    """The policy's state as `HFPolicy` builds it: the backbone in `options.dtype`, LoRA's adapters on the
    linear layers `target_modules` names, the fp32 heads on the decoder's last hidden state (+ proprio)."""
    config = read_config(options.path)
    width = config.get("text_config", {}).get("hidden_size")
    if width is None or "auto_map" in config or "quantization_config" in config:  # packed shapes: not the model's
        return None
    shapes = tensor_shapes(options.path)
    if shapes is None:
        return None
    tied = config.get("tie_word_embeddings", config["text_config"].get("tie_word_embeddings", False))
    if tied:  # one tensor for the input and output embeddings, counted once
        shapes = {name: shape for name, shape in shapes.items() if not name.endswith("lm_head.weight")}
    backbone = sum(math.prod(shape) for shape in shapes.values())
    width += inputs.proprio_dim
    heads = width + 1  # the value head
    if options.head == "gaussian":
        heads += width * inputs.act_dim + inputs.act_dim + inputs.act_dim  # the mean's layer and the log-std
    buffers = (options.action_bins + 6) * 4  # the bins and the image normalisation, fp32
    state = backbone * DTYPE_BYTES[options.dtype] + heads * HEADS_BYTES + buffers
    if options.lora is None:
        return StateSize(state, backbone + heads, backbone * DTYPE_BYTES[options.dtype] + heads * HEADS_BYTES)
    targeted = [
        shape
        for name, shape in shapes.items()
        if len(shape) == 2
        and name.endswith(".weight")
        and any(f".{name[: -len('.weight')]}".endswith(f".{target}") for target in options.lora.target_modules)
    ]  # as peft matches a target: the module's name, or its last dotted parts
    if not targeted:
        raise ValueError(
            f"lora.target_modules: none of {options.lora.target_modules} names a linear layer of {options.path}"
            " (e.g. q_proj, v_proj: the last parts of a layer's name in the checkpoint)"
        )
    adapters = sum(options.lora.r * sum(shape) for shape in targeted)
    trainable_bytes = adapters * ADAPTER_BYTES + heads * HEADS_BYTES
    return StateSize(state + adapters * ADAPTER_BYTES, adapters + heads, trainable_bytes)


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
TEXT_KEYS = (
    "num_hidden_layers",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "hidden_act",
)


def _read_prompt(options: HFOptions) -> tuple[dict[str, Any], list[int]] | None:
    """config.json and the prompt's token ids from tokenizer.json, if they hold every size `hf_stacks` reads."""
    folder = Path(options.path)
    config = read_config(folder)
    vision, text = config.get("vision_config", {}), config.get("text_config", {})
    complete = all(k in vision for k in VISION_KEYS) and all(k in text for k in TEXT_KEYS)
    if "auto_map" in config or not complete or "image_token_index" not in config:
        return None
    if not (folder / "tokenizer.json").exists() or _adjusts_its_tokenizer(folder):
        return None
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    placeholder = tokenizer.id_to_token(config["image_token_index"])
    if placeholder is None:
        return None
    ids = tokenizer.encode(prompt(placeholder, options.instruction)).ids
    return (config, ids) if ids.count(config["image_token_index"]) == 1 else None


def _adjusts_its_tokenizer(folder: Path) -> bool:
    """Whether tokenizer_config.json changes what tokenizer.json alone encodes (transformers applies it)."""
    path = folder / "tokenizer_config.json"
    settings = json.loads(path.read_text()) if path.exists() else {}
    return any(key in settings for key in ("add_bos_token", "add_eos_token", "add_prefix_space"))


def _load_prompt(options: HFOptions) -> tuple[dict[str, Any], list[int]]:
    """The same through transformers: the config with its class's defaults, and its tokenizer."""
    lib = transformers()
    remote = options.trust_remote_code
    config = lib.AutoConfig.from_pretrained(options.path, trust_remote_code=remote)
    tokenizer = lib.AutoTokenizer.from_pretrained(options.path, trust_remote_code=remote)
    placeholder = tokenizer.convert_ids_to_tokens(config.image_token_index)
    return config.to_dict(), tokenizer(prompt(placeholder, options.instruction))["input_ids"]
