"""A gymnasium simulator worker: vectorised envs, auto-reset, episode statistics, trajectory buffer.

Ports: `obs()` the current observations, `step(policy_out)` one step of every env (records what the
policy sent with the actions: log-probs and values), `trajectory()` the steps since the last call.
Observations go out as `{"obs": array, "env_id": global env indices}`. Each env is seeded by its global
index, so results do not depend on how envs are split over replicas or pipeline slices.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

import m2flow


class GymEnvConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    env_id: str
    num_envs: int = Field(1, ge=1, description="envs per replica, cut across pipeline slices")
    clip_actions: bool = True
    env_kwargs: dict[str, Any] = Field(default_factory=dict)


class GymEnv:
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
        self._buffer: dict[str, list] = _empty_buffer()
        self._episode_return = np.zeros(len(self.env_ids))
        self._episode_len = np.zeros(len(self.env_ids), dtype=np.int64)
        self._finished: list[tuple[float, int]] = []
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
        self._buffer["obs"].append(self._obs)
        self._buffer["done"].append(self._done)
        self._buffer["reward"].append(reward.astype(np.float32))
        for key, value in out.items():
            self._buffer[key].append(np.asarray(value))
        done = np.logical_or(terminated, truncated)
        self._episode_return += reward
        self._episode_len += 1
        for i in np.flatnonzero(done):
            self._finished.append((float(self._episode_return[i]), int(self._episode_len[i])))
            self._episode_return[i], self._episode_len[i] = 0.0, 0
        self._obs = next_obs.astype(np.float32)
        self._done = done.astype(np.float32)
        return self.obs()

    def trajectory(self) -> dict[str, np.ndarray]:
        """Everything since the last call, time-major [T, envs, ...], plus the state to bootstrap from."""
        batch = {key: np.stack(values) for key, values in self._buffer.items() if values}
        batch["next_obs"] = self.obs()["obs"].copy()
        batch["next_done"] = self._done.copy()
        batch["env_ids"] = self.env_ids.copy()
        self._buffer = _empty_buffer()
        return batch

    def state_dict(self) -> dict[str, Any]:
        """Everything the next step depends on, for exact resume: physics state, RNGs, step counters,
        the pending observations and episode statistics. Non-MuJoCo envs restart
        their episodes on resume instead."""
        if self._obs is None or not all(_is_mujoco(env) for env in self.envs.envs):
            return {}
        return {
            "envs": [_env_state(env) for env in self.envs.envs],
            "obs": torch.as_tensor(self._obs),
            "done": torch.as_tensor(self._done),
            "episode_return": torch.as_tensor(self._episode_return),
            "episode_len": torch.as_tensor(self._episode_len),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        self.obs()  # the first reset builds the envs' internal state, then it is overwritten
        for env, saved in zip(self.envs.envs, state["envs"], strict=True):
            _set_env_state(env, saved)
        self._obs, self._done = state["obs"].numpy().copy(), state["done"].numpy().copy()
        self._episode_return = state["episode_return"].numpy().copy()
        self._episode_len = state["episode_len"].numpy().copy()

    def metrics(self) -> dict[str, float]:
        """Completed-episode statistics since the last call (absent if no episode ended)."""
        if not self._finished:
            return {}
        returns, lengths = zip(*self._finished, strict=True)
        self._finished = []
        return {
            "env/episode_return": float(np.mean(returns)),
            "env/episode_len": float(np.mean(lengths)),
            "env/episodes": float(len(returns)),
        }


def _empty_buffer() -> dict[str, list]:
    return defaultdict(list)


def _is_mujoco(env: gym.Env) -> bool:
    return hasattr(env.unwrapped, "model") and hasattr(env.unwrapped, "data")


def _env_state(env: gym.Env) -> dict[str, Any]:
    """MuJoCo's full integration state (time, qpos, qvel, activations, warm start, controls, ...)."""
    import mujoco

    inner = env.unwrapped
    spec = mujoco.mjtState.mjSTATE_INTEGRATION
    physics = np.empty(mujoco.mj_stateSize(inner.model, spec))
    mujoco.mj_getState(inner.model, inner.data, physics, spec)
    return {
        "physics": torch.as_tensor(physics),
        "rng": inner.np_random.bit_generator.state,
        "elapsed": _time_limit(env)._elapsed_steps,
    }


def _set_env_state(env: gym.Env, saved: dict[str, Any]) -> None:
    import mujoco

    inner = env.unwrapped
    mujoco.mj_setState(inner.model, inner.data, saved["physics"].numpy(), mujoco.mjtState.mjSTATE_INTEGRATION)
    mujoco.mj_forward(inner.model, inner.data)
    inner.np_random.bit_generator.state = saved["rng"]
    _time_limit(env)._elapsed_steps = saved["elapsed"]


def _time_limit(env: gym.Env) -> gym.wrappers.TimeLimit:
    while not isinstance(env, gym.wrappers.TimeLimit):
        env = env.env
    return env
