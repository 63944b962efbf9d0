"""robosuite tasks as gymnasium envs, for `CameraEnv` (`pip install m2flow[robosuite]`):
`env_id: Robosuite/<task>-<robot>`, e.g. `Robosuite/Lift-Panda`; `env_kwargs` go to `robosuite.make`.

robosuite's own renderers stay off — `CameraEnv` renders only the cameras the policy reads, with its
render profiles, from the same MuJoCo model — so a step is physics and control only. The state
observation is the robot's proprioception and the object state; `info["success"]` is the task's own
check. The sim is kept across resets (`hard_reset=False`), so renderers stay bound to one model;
`reset(seed=s)` re-seeds robosuite's generator, so equal seeds give equal initial states.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from m2flow.errors import MissingDependency

PREFIX = "Robosuite/"
STATE_KEYS = ("robot0_proprio-state", "object-state")


class RobosuiteEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, task: str, robot: str, horizon: int = 200, control_freq: int = 20, **kwargs: Any):
        try:
            import robosuite
        except ImportError:
            raise MissingDependency(
                f"env_id '{PREFIX}{task}-{robot}' needs robosuite: pip install m2flow[robosuite]"
                " (robosuite 1.5.2 with mujoco 3.3.0; it pins numpy 1.26)"
            ) from None
        settings = {
            "seed": 0,  # the scene built at construction (e.g. the cube's size) is the same in every env
            "reward_shaping": True,
            "use_object_obs": True,
            **kwargs,
            "has_renderer": False,
            "has_offscreen_renderer": False,
            "use_camera_obs": False,
            "hard_reset": False,
            "horizon": horizon,
            "control_freq": control_freq,
        }
        self.suite = robosuite.make(task, robots=robot, **settings)
        size = len(self._state(self.suite.reset()))
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (size,), np.float32)
        low, high = self.suite.action_spec
        self.action_space = gym.spaces.Box(low.astype(np.float32), high.astype(np.float32))

    @property
    def model(self):
        return self.suite.sim.model._model

    @property
    def data(self):
        return self.suite.sim.data._data

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:  # in place: robosuite's placement samplers hold this very generator
            self.suite.rng.bit_generator.state = np.random.default_rng(seed).bit_generator.state
        return self._state(self.suite.reset()), {}

    def step(self, action: np.ndarray):
        obs, reward, done, info = self.suite.step(np.asarray(action, dtype=np.float64))
        info = {**info, "success": float(self.suite._check_success())}
        return self._state(obs), float(reward), False, bool(done), info

    def close(self) -> None:
        self.suite.close()

    @staticmethod
    def _state(obs: dict[str, np.ndarray]) -> np.ndarray:
        return np.concatenate([np.asarray(obs[k], np.float32).ravel() for k in STATE_KEYS if k in obs])


def make(env_id: str, **kwargs: Any) -> gym.Env:
    """`Robosuite/Lift-Panda` -> RobosuiteEnv("Lift", "Panda")."""
    task, _, robot = env_id.removeprefix(PREFIX).partition("-")
    if not robot:
        raise ValueError(f"env_id '{env_id}': expected {PREFIX}<task>-<robot>, e.g. {PREFIX}Lift-Panda")
    return RobosuiteEnv(task, robot, **kwargs)
