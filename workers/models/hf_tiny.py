"""Random vision-language models in a local folder, for tests, CI, benchmarks and trying `model: hf` without
a hub: a LLaVA (a CLIP vision tower, a projector, a LLaMA decoder) with its processor (a word-level tokenizer
and a CLIP image processor) — everything transformers' `from_pretrained` reads. `tiny` (~0.2M parameters,
32x32 images) for tests; `0.7b` (a ViT-B/16 tower at 224x224 and a 20-layer, 1536-wide decoder) for GPU
benchmarks, shaped like the small VLAs RLinf's users train.

    python -m m2flow.workers.models.hf_tiny runs/models/tiny-vlm [--size tiny|0.7b]
"""

from __future__ import annotations

import argparse
from pathlib import Path

WORDS = ["<pad>", "<s>", "</s>", "<unk>", "<image>"]
VOCABULARY = "pick place push reach open close the a red green blue cube block drawer door bin handle to in on run"

SIZES = {
    "tiny": {
        "image_size": 32,
        "patch": 8,
        "vision": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2},
        "decoder": {
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": 512,
        },
    },
    "0.7b": {
        "image_size": 224,
        "patch": 16,
        "vision": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12},
        "decoder": {
            "hidden_size": 1536,
            "intermediate_size": 4096,
            "num_hidden_layers": 20,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "vocab_size": 32000,
        },
    },
}


def make_tiny_vlm(folder: str | Path, size: str = "tiny") -> Path:
    """Write a random LLaVA of the given size and its processor to `folder` (save_pretrained)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        AutoModelForImageTextToText,
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaProcessor,
        PreTrainedTokenizerFast,
    )

    shape = SIZES[size]
    image_size, patch = shape["image_size"], shape["patch"]
    folder = Path(folder)
    words = WORDS + VOCABULARY.split()
    tokenizer = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    text = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    text.add_special_tokens({"additional_special_tokens": ["<image>"]})
    crop = {"height": image_size, "width": image_size}
    images = CLIPImageProcessor(size={"shortest_edge": image_size}, crop_size=crop)
    processor = LlavaProcessor(
        image_processor=images,
        tokenizer=text,
        patch_size=patch,
        vision_feature_select_strategy="default",  # the CLS feature is dropped: one token per patch
        image_token="<image>",
        num_additional_image_tokens=1,
    )
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(**shape["vision"], image_size=image_size, patch_size=patch),
        text_config=LlamaConfig(**shape["decoder"], max_position_embeddings=1024),
        image_token_index=words.index("<image>"),
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
    )
    torch.manual_seed(0)
    AutoModelForImageTextToText.from_config(config).save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--size", default="tiny", choices=list(SIZES))
    args = parser.parse_args()
    print(f"wrote {make_tiny_vlm(args.folder, args.size)}")


if __name__ == "__main__":
    main()
