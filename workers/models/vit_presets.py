"""The ViT policy's size presets, shape checks and token count: plain numbers, no torch, for the planner."""

from __future__ import annotations

from m2flow.workers.models.inputs import VisionInputs

# preset -> (width, depth, heads); a block holds ~12 x width^2 parameters
VIT_SIZES = {"1m": (128, 4, 4), "10m": (384, 6, 6), "30m": (512, 10, 8), "100m": (768, 14, 12), "300m": (1024, 24, 16)}


def vit_shape(size: str, width: int | None, depth: int | None, heads: int | None) -> tuple[int, int, int]:
    preset = VIT_SIZES[size]
    return width or preset[0], depth or preset[1], heads or preset[2]


def vit_tokens(inputs: VisionInputs, patch: int) -> int:
    """Tokens per sample: the image's patches, a proprioception token (if any) and the readout token."""
    return (inputs.size[0] // patch) * (inputs.size[1] // patch) + (1 if inputs.proprio_dim else 0) + 1


def check_vit(width: int, heads: int, size: tuple[int, int], patch: int) -> None:
    """ValueError for a shape the ViT cannot take: heads that do not divide the width, patches that do not
    tile the image."""
    if width % heads:
        raise ValueError(f"width {width} must be a multiple of heads {heads}")
    if size[0] % patch or size[1] % patch:
        raise ValueError(f"image size {size} must be a multiple of the patch size {patch}")
