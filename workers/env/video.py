"""Episode videos of evaluation episodes, rendered with the `full` profile on a copy of the model (the
policy's observations keep their own profile), with the episode's return and success drawn on the frames
when asked; MP4 (ffmpeg from imageio-ffmpeg) or GIF, written to a temporary name and renamed into place."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import ConfigDict, Field, model_validator

from m2flow.strict_numbers import NumbersNotBooleans
from m2flow.workers.env.observation import ImageSize

if TYPE_CHECKING:
    import mujoco


class VideoConfig(NumbersNotBooleans):
    model_config = ConfigDict(extra="forbid")

    save: bool = False
    camera: str | None = Field(None, description="default: the first observed camera")
    size: ImageSize = (240, 320)
    format: Literal["mp4", "gif"] = "mp4"
    fps: int = Field(30, ge=1)
    overlay: bool = True

    @model_validator(mode="after")
    def _writer_installed(self) -> VideoConfig:
        if self.save and self.format == "mp4" and importlib.util.find_spec("imageio_ffmpeg") is None:
            raise ValueError("format: mp4 needs imageio-ffmpeg (pip install imageio-ffmpeg); or format: gif")
        return self


class EpisodeVideo:
    def __init__(self, config: VideoConfig, model: mujoco.MjModel, camera: str, folder: str | Path):
        from m2flow.workers.env.rendering import CameraRenderer

        self.config, self.folder = config, Path(folder)
        self.renderer = CameraRenderer([copy.copy(model)], [camera], ["rgb"], config.size, "full")
        self.frames: list[np.ndarray] = []

    def frame(self, data: mujoco.MjData) -> None:
        self.frames.append(self.renderer.render([data])["rgb"][0, 0])

    def save(self, name: str, episode_return: float, success: float) -> Path:
        """Write the frames since the last save as `<folder>/<name>.<format>`."""
        frames, self.frames = self.frames, []
        if self.config.overlay:
            frames = [self._overlay(f, episode_return, success) for f in frames]
        path = self.folder / f"{name}.{self.config.format}"
        self.folder.mkdir(parents=True, exist_ok=True)
        _write(path, frames, self.config.fps)
        return path

    @staticmethod
    def _overlay(frame: np.ndarray, episode_return: float, success: float) -> np.ndarray:
        from PIL import Image, ImageDraw

        image = Image.fromarray(frame)
        text = f"return {episode_return:.1f}" + ("" if np.isnan(success) else f"  success {int(success)}")
        ImageDraw.Draw(image).text((6, 6), text, fill=(255, 255, 0))
        return np.asarray(image)


def _write(path: Path, frames: list[np.ndarray], fps: int) -> None:
    import imageio.v2 as imageio

    tmp = path.with_name(f".{path.name}")
    if path.suffix == ".gif":
        imageio.mimsave(tmp, frames, format="GIF", duration=1 / fps)
    else:
        imageio.mimsave(tmp, frames, format="FFMPEG", fps=fps)
    tmp.replace(path)
