"""Headless MuJoCo rendering of the cameras and modalities a policy reads — nothing else.

All the envs of a simulator process render in one GL context, side by side into one frame buffer: each
(env, camera) pair draws its tile, and the whole buffer is read back once per pass (colour for `rgb`;
flat id colours and the depth buffer for `depth` and `segmentation`). A read-back waits for the GPU, so
reading one frame per env bounds a process at a few hundred frames per second on a GPU that would draw
ten times as many (RESULTS.md, "Why pipelining does not pay on one GPU"); tiles give each env the image
`mujoco.Renderer` would (`tests/unit/test_rendering.py`). With pipeline slices each slice is a simulator
instance of its own: one frame buffer and one read-back per slice.

Render settings are named profiles: `fast` (no anti-aliasing, no shadow map, no reflections: 20-50x
cheaper on a CPU renderer, images still correct) for training, `full` (MuJoCo's defaults) for videos.
They must be applied before the first render: the GL context reads them when it is created.

Under EGL a simulator renders on the GPU the plan chose for it (`MUJOCO_EGL_DEVICE_ID`, set per process
by the launcher); a GL context that cannot be made is reported with what EGL needs, never as a bare
EGL error.
"""

from __future__ import annotations

import glob
import math
import os
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext

import mujoco
import numpy as np


def _fast(model: mujoco.MjModel) -> None:
    model.vis.quality.offsamples = 0
    model.vis.quality.shadowsize = 0
    model.mat_reflectance[:] = 0


RENDER_PROFILES: dict[str, Callable[[mujoco.MjModel], None]] = {"fast": _fast, "full": lambda model: None}
IMAGE_MODALITIES = ("rgb", "depth", "segmentation")
MAX_BUFFER_SIDE = 8192  # pixels: every GL driver MuJoCo runs on offers frame buffers at least this large


def _anywhere(index: int) -> AbstractContextManager:
    return nullcontext()


class CameraRenderer:
    """Renders the named cameras of the datas of `models` (one model, or copies of it: one per env) in the
    requested image modalities, all tiles of one call in one frame buffer; counts frames per modality."""

    def __init__(
        self,
        models: Sequence[mujoco.MjModel],
        cameras: list[str],
        modalities: list[str],
        size: tuple[int, int],
        profile: str,
    ):
        self.models = list(models)
        model = models[0]
        known = [model.camera(i).name for i in range(model.ncam)]
        missing = [c for c in cameras if c not in known]
        if missing:
            raise ValueError(f"cameras {missing} are not in this model (it has: {', '.join(known) or 'none'})")
        for each in models:
            RENDER_PROFILES[profile](each)
        self.cameras = [mujoco.MjvCamera() for _ in cameras]
        for camera, name in zip(self.cameras, cameras, strict=True):
            camera.type, camera.fixedcamid = mujoco.mjtCamera.mjCAMERA_FIXED, model.camera(name).id
        self.modalities = [m for m in modalities if m in IMAGE_MODALITIES]
        self.height, self.width = size
        self.calls: Counter = Counter()
        self.gl = self.context = None
        if self.modalities:
            self.columns, rows = _grid(len(models) * len(cameras), size)
            model.vis.global_.offwidth = max(model.vis.global_.offwidth, self.columns * self.width)
            model.vis.global_.offheight = max(model.vis.global_.offheight, rows * self.height)
            self.gl = _gl_context(self.width, self.height)  # MuJoCo draws into its own offscreen buffer
            self.gl.make_current()
            self.context = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_150)
            mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self.context)
            self.context.readDepthMap = mujoco.mjtDepthMap.mjDEPTH_ZEROFAR
            self.scene = mujoco.MjvScene(model, maxgeom=10_000)
            self.option = mujoco.MjvOption()
            extent = model.stat.extent
            self.near, self.far = model.vis.map.znear * extent, model.vis.map.zfar * extent

    def render(
        self,
        datas: Sequence[mujoco.MjData],
        working: Callable[[int], AbstractContextManager] = _anywhere,
        slots: Sequence[int] | None = None,
    ) -> dict[str, np.ndarray]:
        """{modality: [datas, cameras, h, w(, 3)]} for the requested image modalities only. Data i is of the
        model in slot `slots[i]` (default i) and draws in that slot's tiles: a data drawn in its own slot
        every time gets the same pixels every time (a GL rasteriser may round a tile's edges by where it
        lies). A scene that fails to build or draw raises inside `working(i)`."""
        if not self.modalities:
            return {}
        self.gl.make_current()
        slots = range(len(datas)) if slots is None else slots
        out: dict[str, np.ndarray] = {}
        if "rgb" in self.modalities:
            colours, _, _ = self._pass(datas, slots, working, ids=False)
            out["rgb"] = self._cut(colours, slots)
        if "depth" in self.modalities or "segmentation" in self.modalities:
            colours, depth, objects = self._pass(datas, slots, working, ids=True)
            if "depth" in self.modalities:
                out["depth"] = self._cut(self._metres(depth), slots)
            if "segmentation" in self.modalities:
                segments = self._cut(_segment_ids(colours), slots)
                objects_drawn = np.take_along_axis(objects, segments.reshape(*objects.shape[:2], -1), axis=2)
                out["segmentation"] = objects_drawn.reshape(segments.shape)
        for modality in out:
            self.calls[modality] += len(datas) * len(self.cameras)
        return out

    def _pass(self, datas, slots, working, ids: bool) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """Every tile drawn, then the frame buffer read once: its colours, or with `ids` each scene's geoms
        in flat id colours, the depth buffer and per tile the table from segment id + 1 to object id."""
        flags = self.scene.flags
        flags[mujoco.mjtRndFlag.mjRND_SEGMENT] = flags[mujoco.mjtRndFlag.mjRND_IDCOLOR] = ids
        objects = np.full((len(datas), len(self.cameras), self.scene.maxgeom + 1), -1, np.int32) if ids else None
        for i, (data, slot) in enumerate(zip(datas, slots, strict=True)):
            with working(i):
                for c, (camera, tile) in enumerate(zip(self.cameras, self._tiles(slot), strict=True)):
                    mujoco.mjv_updateScene(
                        self.models[slot], data, self.option, None, camera, mujoco.mjtCatBit.mjCAT_ALL, self.scene
                    )
                    mujoco.mjr_render(self._rect(tile), self.scene, self.context)
                    if ids:
                        self._object_ids(objects[i, c])
        drawn = self._tiles(max(slots))[-1] + 1
        area = mujoco.MjrRect(
            0, 0, min(drawn, self.columns) * self.width, math.ceil(drawn / self.columns) * self.height
        )
        colours = np.empty((area.height, area.width, 3), np.uint8)
        depth = np.empty((area.height, area.width), np.float32) if ids else None
        mujoco.mjr_readPixels(colours, depth, area, self.context)
        return colours, depth, objects

    def _tiles(self, slot: int) -> range:
        """The tiles of a slot's cameras."""
        return range(slot * len(self.cameras), (slot + 1) * len(self.cameras))

    def _rect(self, tile: int) -> mujoco.MjrRect:
        row, column = divmod(tile, self.columns)
        return mujoco.MjrRect(column * self.width, row * self.height, self.width, self.height)

    def _cut(self, frame: np.ndarray, slots: Sequence[int]) -> np.ndarray:
        """The frame buffer (read bottom row first) cut into [datas, cameras, h, w(, ...)] images."""
        h, w = self.height, self.width
        rects = [self._rect(tile) for slot in slots for tile in self._tiles(slot)]
        images = [np.flipud(frame[r.bottom : r.bottom + h, r.left : r.left + w]) for r in rects]
        return np.stack(images).reshape(len(slots), len(self.cameras), *images[0].shape)

    def _metres(self, depth: np.ndarray) -> np.ndarray:
        """The depth buffer (read as MuJoCo's zero-far map: 1 near, 0 far) as distance from the camera, as
        `mujoco.Renderer` gives it."""
        far, near = np.float32(self.far), np.float32(self.near)
        c = np.float32(-0.5) * (-(far + near) / (far - near)) - np.float32(0.5)
        d = np.float32(-0.5) * (-(np.float32(2) * far * near) / (far - near))
        return (d / (depth.astype(np.float64) + c)).astype(np.float32)

    def _object_ids(self, table: np.ndarray) -> None:
        """`table[segment id + 1]`: the object each geom of the current scene draws (-1: background)."""
        for geom in self.scene.geoms[: self.scene.ngeom]:
            if geom.segid != -1:
                table[geom.segid + 1] = geom.objid

    def close(self) -> None:
        if self.context is not None:
            self.gl.make_current()  # the buffers freed are this context's, whichever was current
            self.context.free()
            self.gl.free()
            self.context = self.gl = None


def _grid(tiles: int, size: tuple[int, int]) -> tuple[int, int]:
    """Columns and rows of `tiles` images of `size` in a frame buffer no side of which passes MAX_BUFFER_SIDE."""
    height, width = size
    columns = max(1, min(tiles, MAX_BUFFER_SIDE // width))
    rows = math.ceil(tiles / columns)
    if rows * height > MAX_BUFFER_SIDE or width > MAX_BUFFER_SIDE:
        raise ValueError(
            f"{tiles} camera images of {height}x{width} do not fit one {MAX_BUFFER_SIDE}x{MAX_BUFFER_SIDE} frame"
            " buffer: give each simulator replica fewer envs (num_envs) or cameras, or smaller images"
        )
    return columns, rows


def _segment_ids(colours: np.ndarray) -> np.ndarray:
    """Flat id colours back to segment id + 1 (0: background)."""
    rgb = colours.astype(np.int32)
    return rgb[..., 0] + rgb[..., 1] * 2**8 + rgb[..., 2] * 2**16


VENDOR_DIRS = ("/usr/share/glvnd/egl_vendor.d", "/etc/glvnd/egl_vendor.d", "/usr/local/share/glvnd/egl_vendor.d")


def _gl_context(width: int, height: int):
    from mujoco import gl_context

    try:
        return gl_context.GLContext(width, height)
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
