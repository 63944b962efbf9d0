"""What a camera simulator renders for the policy (`CameraObservation`): plain settings shared by the
simulator's and the policy's args, importable without MuJoCo."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from m2flow.strict_numbers import NumbersNotBooleans

Pixels = Annotated[int, Field(ge=1, le=8192)]
ImageSize = tuple[Pixels, Pixels]  # (height, width) of a rendered image, as configs write it
Modality = Literal["rgb", "depth", "segmentation", "proprio"]


class CameraObservation(NumbersNotBooleans):
    model_config = ConfigDict(extra="forbid")

    cameras: list[str] = Field(min_length=1)
    modalities: list[Modality] = Field(default_factory=lambda: ["rgb"], min_length=1)
    size: ImageSize = (84, 84)
