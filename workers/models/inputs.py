"""What a camera policy reads and emits (`VisionInputs`), and the image channels it stacks: plain sizes, no
torch, so the planner sizes a model without building it."""

from __future__ import annotations

from dataclasses import dataclass

IMAGE_CHANNELS = {"rgb": 3, "depth": 1, "segmentation": 1}
DEPTH_SCALE_M = 10.0
CONVS = [(8, 4, 32), (4, 2, 64), (3, 1, 64)]  # kernel, stride, output channels (Nature-CNN, for 64-128 px)


@dataclass(frozen=True)
class VisionInputs:
    """What a camera policy reads and emits: modalities of `cameras` images of `size`, proprioception of
    `proprio_dim` (0: none), actions (a chunk of them) of `act_dim`."""

    modalities: list[str]
    cameras: int
    size: tuple[int, int]
    proprio_dim: int
    act_dim: int


def image_channels(modalities: list[str], cameras: int) -> int:
    return cameras * sum(IMAGE_CHANNELS.get(m, 0) for m in modalities)


def reads_of(modalities: list[str], proprio_dim: int) -> list[str]:
    """The observation keys a policy reads: its image modalities, and proprioception if it has any."""
    return [m for m in modalities if m in IMAGE_CHANNELS] + (["proprio"] if proprio_dim else [])


def pixel_convs(inputs: VisionInputs) -> tuple[list[tuple[int, int, int, int]], int]:
    """The pixel encoder's convolutions as (in channels, out channels, kernel, stride), and the size of their
    flattened output; ValueError for images too small for them."""
    convs = []
    h, w, c_in = *inputs.size, image_channels(inputs.modalities, inputs.cameras)
    for kernel, stride, c_out in CONVS:
        convs.append((c_in, c_out, kernel, stride))
        h, w, c_in = (h - kernel) // stride + 1, (w - kernel) // stride + 1, c_out
    if h < 1 or w < 1:
        raise ValueError(f"images of {inputs.size} are too small for the encoder; use at least 36x36")
    return convs, c_in * h * w
