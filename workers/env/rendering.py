"""Headless MuJoCo rendering of the cameras and modalities a policy reads — nothing else.

Render settings are named profiles: `fast` (no anti-aliasing, no shadow map, no reflections: 20-50x
cheaper on a CPU renderer, images still correct) for training, `full` (MuJoCo's defaults) for videos.
They must be applied before the first render: the GL context reads them when it is created.

Under EGL a simulator renders on the GPU the plan chose for it (`MUJOCO_EGL_DEVICE_ID`, set per process
by the launcher); a GL context that cannot be made is reported with what EGL needs, never as a bare
EGL error.
"""

from __future__ import annotations

import glob
import os
from collections import Counter
from collections.abc import Callable

import mujoco
import numpy as np


def _fast(model: mujoco.MjModel) -> None:
    model.vis.quality.offsamples = 0
    model.vis.quality.shadowsize = 0
    model.mat_reflectance[:] = 0


RENDER_PROFILES: dict[str, Callable[[mujoco.MjModel], None]] = {"fast": _fast, "full": lambda model: None}
IMAGE_MODALITIES = ("rgb", "depth", "segmentation")


class CameraRenderer:
    """Renders the named cameras of one MuJoCo model in the requested image modalities, counting renders."""

    def __init__(
        self, model: mujoco.MjModel, cameras: list[str], modalities: list[str], size: tuple[int, int], profile: str
    ):
        known = [model.camera(i).name for i in range(model.ncam)]
        missing = [c for c in cameras if c not in known]
        if missing:
            raise ValueError(f"cameras {missing} are not in this model (it has: {', '.join(known) or 'none'})")
        RENDER_PROFILES[profile](model)
        self.cameras = cameras
        self.modalities = [m for m in modalities if m in IMAGE_MODALITIES]
        self.renderer = _renderer(model, size) if self.modalities else None
        self.calls: Counter = Counter()

    def render(self, data: mujoco.MjData) -> dict[str, np.ndarray]:
        """{modality: [cameras, h, w(, 3)]} for the requested image modalities only."""
        out: dict[str, list] = {m: [] for m in self.modalities}
        for camera in self.cameras:
            self.renderer.update_scene(data, camera=camera)
            for modality in self.modalities:
                self._mode(modality)
                image = self.renderer.render()
                out[modality].append(image[..., 0].astype(np.int32) if modality == "segmentation" else image)
                self.calls[modality] += 1
            self._mode("rgb")
        return {m: np.stack(images) for m, images in out.items()}

    def _mode(self, modality: str) -> None:
        self.renderer.disable_depth_rendering()
        self.renderer.disable_segmentation_rendering()
        if modality == "depth":
            self.renderer.enable_depth_rendering()
        elif modality == "segmentation":
            self.renderer.enable_segmentation_rendering()

    def close(self) -> None:
        if self.renderer is not None:
            self.renderer.close()


VENDOR_DIRS = ("/usr/share/glvnd/egl_vendor.d", "/etc/glvnd/egl_vendor.d", "/usr/local/share/glvnd/egl_vendor.d")


def _renderer(model: mujoco.MjModel, size: tuple[int, int]) -> mujoco.Renderer:
    try:
        return mujoco.Renderer(model, *size)
    except ValueError:  # an image larger than the model's offscreen buffer: MuJoCo's message says so
        raise
    except Exception as exc:  # noqa: BLE001 - EGL/OSMesa fail in many ways; each is explained the same way
        raise RuntimeError(_no_gl_context(exc)) from None


def _no_gl_context(exc: Exception) -> str:
    """Why MuJoCo could not make a GL context, and what to install or set."""
    backend = os.environ.get("MUJOCO_GL", "(unset)")
    problem = f"MuJoCo could not make a GL context (MUJOCO_GL={backend}): {type(exc).__name__}: {exc}"
    if backend != "egl":
        return f"{problem}. Install OSMesa (Debian: libosmesa6) or use MUJOCO_GL=egl"
    device = os.environ.get("MUJOCO_EGL_DEVICE_ID")
    where = f" on EGL device {device} (MUJOCO_EGL_DEVICE_ID: the plan's render GPU, or yours)" if device else ""
    named = os.environ.get("__EGL_VENDOR_LIBRARY_FILENAMES")
    vendors = named.split(":") if named else sorted(f for d in VENDOR_DIRS for f in glob.glob(f"{d}/*.json"))
    return (
        f"{problem}{where}. EGL's vendor files here: {', '.join(vendors) or 'none'}. On an NVIDIA GPU EGL needs"
        " the driver's (10_nvidia.json, from its GL libraries, e.g. Debian libnvidia-gl or libegl-nvidia0; or"
        " name it in __EGL_VENDOR_LIBRARY_FILENAMES); without a GPU, Mesa's (libegl-mesa0)"
    )
