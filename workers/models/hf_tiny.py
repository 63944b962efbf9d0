"""A tiny random vision-language model in a local folder, for tests, CI and trying `model: hf` without a hub:
a LLaVA (a CLIP vision tower, a projector, a LLaMA decoder) of ~0.2M parameters, with its processor (a
word-level tokenizer and a CLIP image processor) — everything transformers' `from_pretrained` reads.

    python -m m2flow.workers.models.hf_tiny runs/models/tiny-vlm [--image-size 32]
"""

from __future__ import annotations

import argparse
from pathlib import Path

WORDS = ["<pad>", "<s>", "</s>", "<unk>", "<image>"]
VOCABULARY = "pick place push reach open close the a red green blue cube block drawer door bin handle to in on"


def make_tiny_vlm(
    folder: str | Path, image_size: int = 32, patch: int = 8, vocab_size: int = 512, seed: int = 0
) -> Path:
    """Write a random tiny LLaVA and its processor to `folder` (save_pretrained); returns the folder."""
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

    folder = Path(folder)
    words = WORDS + VOCABULARY.split()
    tokenizer = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    text = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    text.add_special_tokens({"additional_special_tokens": ["<image>"]})
    size = {"height": image_size, "width": image_size}
    images = CLIPImageProcessor(size={"shortest_edge": image_size}, crop_size=size)
    processor = LlavaProcessor(
        image_processor=images,
        tokenizer=text,
        patch_size=patch,
        vision_feature_select_strategy="default",  # the CLS feature is dropped: one token per patch
        image_token="<image>",
        num_additional_image_tokens=1,
    )
    vision = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=image_size,
        patch_size=patch,
    )
    decoder = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=vocab_size,
        max_position_embeddings=512,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=decoder,
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
    parser.add_argument("--image-size", type=int, default=32)
    args = parser.parse_args()
    print(f"wrote {make_tiny_vlm(args.folder, args.image_size)}")


if __name__ == "__main__":
    main()
