"""The robosuite adapter (`pip install m2flow[robosuite]`). Without the extra (as in CI) only the error
paths run; with it (PYTHONPATH holding robosuite 1.5.2) a Lift task runs through CameraEnv."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from m2flow.context import WorkerContext, set_context
from m2flow.errors import MissingDependency
from m2flow.workers.env.env_ids import make_env


def test_robosuite_ids_name_the_extra_and_the_id_form(monkeypatch):
    monkeypatch.setitem(sys.modules, "robosuite", None)  # as if the extra were not installed
    with pytest.raises(MissingDependency, match=r"pip install m2flow\[robosuite\]"):
        make_env("Robosuite/Lift-Panda")
    with pytest.raises(ValueError, match="expected Robosuite/<task>-<robot>"):
        make_env("Robosuite/Lift")


def test_lift_renders_only_the_cameras_the_policy_reads():
    pytest.importorskip("robosuite")
    from m2flow.workers.env import CameraEnv

    set_context(WorkerContext(items=(0, 2), seed=3))
    try:
        view = {"cameras": ["agentview", "robot0_eye_in_hand"], "modalities": ["rgb", "proprio"], "size": [64, 64]}
        env = CameraEnv(
            env_id="Robosuite/Lift-Panda",
            num_envs=2,
            chunk=4,
            group_size=2,
            env_kwargs={"horizon": 40},
            observation=view,
        )
        first = env.obs()
        assert first["rgb"].shape == (2, 2, 64, 64, 3) and first["proprio"].shape[0] == 2
        np.testing.assert_array_equal(first["proprio"][0], first["proprio"][1])  # one group, one seed: one start
        rng = np.random.default_rng(0)
        for _ in range(12):  # 48 steps: every 40-step episode ends once
            env.step({"action": rng.uniform(-1, 1, (2, 4, 7)).astype(np.float32)})
        assert env.render_calls == {"rgb": 2 * 13 * 2}  # per env: the first observation + one per chunk, 2 cameras
        metrics = env.metrics()
        assert metrics["env/episodes"] == 2 and metrics["env/episode_len"] == 40
        assert "env/success_rate" in metrics
    finally:
        set_context(WorkerContext())
