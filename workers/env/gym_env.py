"""A gymnasium simulator worker: vectorised envs, auto-reset, episode statistics, trajectory buffer.

Ports: `obs()` the current observations, `step(policy_out)` one step of every env (records what the
policy sent with the actions: log-probs and values), `trajectory()` the steps since the last call.
Observations go out as `{"obs": array, "env_id": global env indices}`. Each env is seeded by its global
index, so results do not depend on how envs are split over replicas or pipeline slices.
"""

from __future__ import annotations

from typing import Annotated, Any

import gymnasium as gym
import numpy as np
from pydantic import AfterValidator, Field

import m2flow
from m2flow.workers.env.env_ids import registered
from m2flow.workers.env.mujoco_state import is_mujoco, load_simulator_state, simulator_state
from m2flow.workers.env.recording import Recorder


class GymEnvConfig(m2flow.WorkerConfig):
    items_field = "num_envs"

    env_id: Annotated[str, AfterValidator(registered)]
    num_envs: int = Field(1, ge=1, description="envs per replica, cut across pipeline slices")
    clip_actions: bool = True
    env_kwargs: dict[str, Any] = Field(default_factory=dict)


class GymEnv:
    Config = GymEnvConfig

    def __init__(self, **args: Any):
        self.config = GymEnvConfig(**args)
        ctx = m2flow.context()
        first, last = ctx.items
        self.env_ids = np.arange(first, last)
        self.envs = gym.vector.SyncVectorEnv(
            [lambda: gym.make(self.config.env_id, **self.config.env_kwargs) for _ in self.env_ids],
            autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        )
        self.seeds = [ctx.seed + int(i) for i in self.env_ids]
        self._obs: np.ndarray | None = None
        self._done = np.zeros(len(self.env_ids), dtype=np.float32)
        self.recorder = Recorder(len(self.env_ids))
        self.low, self.high = self.envs.single_action_space.low, self.envs.single_action_space.high

    def obs(self) -> dict[str, np.ndarray]:
        if self._obs is None:
            self._obs, _ = self.envs.reset(seed=self.seeds)
            self._obs = self._obs.astype(np.float32)
        return {"obs": self._obs, "env_id": self.env_ids}

    def step(self, policy_out: dict[str, np.ndarray] | np.ndarray) -> dict[str, np.ndarray]:
        out = policy_out if isinstance(policy_out, dict) else {"action": policy_out}
        action = np.asarray(out["action"])
        env_action = np.clip(action, self.low, self.high) if self.config.clip_actions else action
        next_obs, reward, terminated, truncated, _ = self.envs.step(env_action)
        self.recorder.record(self._obs, self._done, reward, out)
        done = np.logical_or(terminated, truncated)
        self.recorder.count(reward)
        self.recorder.end_episodes(done)
        self._obs = next_obs.astype(np.float32)
        self._done = done.astype(np.float32)
        return self.obs()

    def trajectory(self) -> dict[str, np.ndarray]:
        """Everything since the last call, time-major [T, envs, ...], plus the state to bootstrap from."""
        return self.recorder.trajectory(self.obs()["obs"].copy(), self._done, self.env_ids)

    def metrics(self) -> dict[str, float]:
        return self.recorder.metrics()

    def state_dict(self) -> dict[str, Any]:
        """Everything the next step depends on, for exact resume: physics state, RNGs, step counters,
        the pending observations and episode statistics. Non-MuJoCo envs restart their episodes instead."""
        if self._obs is None or not all(is_mujoco(env) for env in self.envs.envs):
            return {}
        return simulator_state(self.envs.envs, self.recorder, obs=self._obs, done=self._done)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        self.obs()  # the first reset builds the envs' internal state, then it is overwritten
        arrays = load_simulator_state(self.envs.envs, self.recorder, state)
        self._obs, self._done = arrays["obs"], arrays["done"]
