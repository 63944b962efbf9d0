"""Tiled rendering: all envs of a process in one frame buffer give each env the image a renderer of its own
would, in every modality and camera."""

from __future__ import annotations

from contextlib import contextmanager

import mujoco
import numpy as np
import pytest

from m2flow.workers.env import rendering
from m2flow.workers.env.rendering import CameraRenderer

SCENE = """
<mujoco>
  <worldbody>
    <light pos="0 0 3"/>
    <geom name="floor" type="plane" size="2 2 .1" rgba=".4 .5 .6 1"/>
    <camera name="above" pos="0 0 2.5"/>
    <camera name="side" pos="2 -2 1" xyaxes="1 1 0 -.3 .3 1"/>
    <body name="box" pos="0 0 .5">
      <freejoint/>
      <geom type="box" size=".2 .3 .1" rgba=".9 .2 .2 1"/>
      <geom type="sphere" pos=".3 0 0" size=".12" rgba=".2 .9 .2 1"/>
    </body>
    <body name="pole" pos=".6 .4 .3">
      <geom type="capsule" size=".05 .3" rgba=".2 .2 .9 1"/>
    </body>
  </worldbody>
</mujoco>
"""
MODALITIES = ["rgb", "depth", "segmentation"]
SIZE = (40, 56)


def scenes(count: int) -> tuple[list[mujoco.MjModel], list[mujoco.MjData]]:
    """`count` copies of the scene, the box in a different pose in each."""
    models = [mujoco.MjModel.from_xml_string(SCENE) for _ in range(count)]
    datas = [mujoco.MjData(m) for m in models]
    for i, (model, data) in enumerate(zip(models, datas, strict=True)):
        data.qpos[:3] = [0.3 * np.cos(i), 0.3 * np.sin(i), 0.4 + 0.1 * i]
        data.qpos[3:7] = [np.cos(0.4 * i), 0, 0, np.sin(0.4 * i)]
        mujoco.mj_forward(model, data)
    return models, datas


def reference(model: mujoco.MjModel, data: mujoco.MjData, cameras: list[str]) -> dict[str, np.ndarray]:
    """What `mujoco.Renderer` gives, one image at a time: {modality: [cameras, h, w(, 3)]}."""
    renderer = mujoco.Renderer(model, *SIZE)
    out: dict[str, list] = {m: [] for m in MODALITIES}
    for camera in cameras:
        renderer.update_scene(data, camera=camera)
        out["rgb"].append(renderer.render())
        renderer.enable_depth_rendering()
        out["depth"].append(renderer.render())
        renderer.enable_segmentation_rendering()
        out["segmentation"].append(renderer.render()[..., 0])  # the object id (the type is [..., 1])
        renderer.disable_segmentation_rendering()
    renderer.close()
    return {m: np.stack(images) for m, images in out.items()}


@pytest.mark.parametrize("buffer_side", [8192, 200], ids=["one row", "a grid of rows"])
def test_tiles_match_mujoco_s_own_renderer_in_every_camera_and_modality(buffer_side, monkeypatch):
    monkeypatch.setattr(rendering, "MAX_BUFFER_SIDE", buffer_side)  # 200: three 56-wide tiles a row, four rows
    models, datas = scenes(5)
    tiled = CameraRenderer(models, ["above", "side"], MODALITIES, SIZE, "fast").render(datas)
    want = [reference(m, d, ["above", "side"]) for m, d in zip(models, datas, strict=True)]
    for modality in MODALITIES:
        assert tiled[modality].shape == (5, 2, *SIZE, *((3,) if modality == "rgb" else ()))
    np.testing.assert_array_equal(tiled["segmentation"], np.stack([w["segmentation"] for w in want]))
    rgb_gap = np.abs(tiled["rgb"].astype(int) - np.stack([w["rgb"] for w in want]))
    assert rgb_gap.max() <= 1 and (rgb_gap > 0).mean() < 1e-3, "a GL rasteriser may round a tile's edges"
    np.testing.assert_allclose(tiled["depth"], np.stack([w["depth"] for w in want]), rtol=1e-4)
    assert len(np.unique(tiled["segmentation"])) >= 4, "floor, box geoms and pole are told apart"
    assert not np.array_equal(tiled["rgb"][0], tiled["rgb"][1]), "each tile shows its own env"


def test_an_env_drawn_alone_in_its_slot_gets_the_pixels_it_gets_among_all():
    models, datas = scenes(4)
    renderer = CameraRenderer(models, ["above"], MODALITIES, SIZE, "fast")
    everyone = renderer.render(datas)
    some = renderer.render([datas[3], datas[1]], slots=[3, 1])
    for modality in MODALITIES:
        np.testing.assert_array_equal(some[modality], everyone[modality][[3, 1]], err_msg=modality)
    assert renderer.calls == {"rgb": 6, "depth": 6, "segmentation": 6}


def test_each_env_is_drawn_inside_its_own_working_block():
    models, datas = scenes(3)
    entered: list[int] = []

    @contextmanager
    def working(index: int):
        entered.append(index)
        yield

    CameraRenderer(models, ["above"], ["rgb", "depth"], SIZE, "fast").render(datas, working)
    assert entered == [0, 1, 2, 0, 1, 2], "one block per env and pass (colour, then depth)"


def test_more_images_than_one_frame_buffer_holds_are_refused_with_what_to_change():
    models, _ = scenes(5)
    with pytest.raises(ValueError, match=r"5 camera images of 4096x4096 do not fit .* fewer envs \(num_envs\)"):
        CameraRenderer(models, ["above"], ["rgb"], (4096, 4096), "fast")
