"""Synthetic workers with known costs: they spin the CPU (not sleep) for a declared CPU time per call,
so a benchmark can compare the planner's prediction with what really runs."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from pydantic import Field

import m2flow
from m2flow.sharding import shard_groups


def spin(seconds: float) -> None:
    """Busy-wait until this thread has run on a core for `seconds`: work of a known CPU cost. Two spinning
    processes sharing one core each take about twice as long, as real work does (a spin on the wall clock
    would end on time however little of the core it had, and could not show contention)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class SpinSimulatorConfig(m2flow.WorkerConfig):
    items_field = "num_envs"

    num_envs: int = Field(1, ge=1, description="envs per replica")
    fixed_s: float = Field(0.0, ge=0, description="seconds per step call")
    per_env_s: float = Field(1e-3, ge=0, description="seconds per env stepped")


class SpinSimulator:
    """A simulator whose step costs `fixed_s + per_env_s * envs`; observations are env ids."""

    Config = SpinSimulatorConfig

    def __init__(self, num_envs: int = 1, fixed_s: float = 0.0, per_env_s: float = 1e-3):
        ctx = m2flow.context()
        self.env_ids = np.arange(*ctx.items)
        self.fixed_s, self.per_env_s = fixed_s, per_env_s
        self.steps = 0

    def obs(self) -> dict[str, np.ndarray]:
        return {"obs": self.env_ids.astype(np.float32)[:, None], "env_id": self.env_ids}

    def step(self, actions: Any) -> dict[str, np.ndarray]:
        spin(self.fixed_s + self.per_env_s * len(self.env_ids))
        self.steps += len(self.env_ids)
        return self.obs()

    def trajectory(self) -> dict[str, int]:
        steps, self.steps = self.steps, 0
        return {"steps": steps}


class SpinPolicy:
    """An inference worker whose act costs `fixed_s + per_env_s * batch`."""

    batch_invariant = frozenset({"act"})  # zeros, whatever rows share a call

    def __init__(self, fixed_s: float = 0.0, per_env_s: float = 1e-3):
        self.fixed_s, self.per_env_s = fixed_s, per_env_s
        self.version = -1

    def act(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        spin(self.fixed_s + self.per_env_s * len(batch["obs"]))
        return np.zeros((len(batch["obs"]), 1), dtype=np.float32)

    def load_weights(self, weights: dict) -> None:
        self.version = weights["version"]


class SpinTrainer:
    """A training worker whose update costs `fixed_s + per_step_s * env steps`."""

    def __init__(self, fixed_s: float = 0.01, per_step_s: float = 0.0):
        self.fixed_s, self.per_step_s = fixed_s, per_step_s
        self.version = 0

    def train(self, trajectories: list[dict]) -> dict[str, float]:
        steps = sum(t["steps"] for t in trajectories)
        spin(self.fixed_s + self.per_step_s * steps)
        self.version += 1
        return {"trainer/steps": float(steps)}

    def weights(self) -> dict[str, int]:
        return {"version": self.version}


class SyntheticBatch:
    """A fixed, seeded PPO batch of camera observations (RGB + proprioception), the same every call:
    for timing and comparing training backends without a simulator. Shapes as `CameraEnv` sends them;
    with several replicas each sends its contiguous block of the envs (with their `env_ids`)."""

    def __init__(
        self,
        steps: int = 16,
        envs: int = 32,
        size: tuple[int, int] = (64, 64),
        proprio_dim: int = 17,
        act_dim: int = 6,
        seed: int = 0,
    ):
        rng = np.random.default_rng(seed)
        f32 = np.float32

        def obs(*lead: int) -> dict[str, np.ndarray]:
            return {
                "rgb": rng.integers(0, 255, (*lead, 1, *size, 3), dtype=np.uint8),
                "proprio": rng.normal(size=(*lead, proprio_dim)).astype(f32),
            }

        self.batch = {
            "obs": obs(steps, envs),
            "action": rng.normal(size=(steps, envs, act_dim)).astype(f32),
            "logprob": rng.normal(-8, 0.5, size=(steps, envs)).astype(f32),
            "value": rng.normal(size=(steps, envs)).astype(f32),
            "reward": rng.normal(size=(steps, envs)).astype(f32),
            "done": (rng.random((steps, envs)) < 0.05).astype(f32),
            "next_obs": obs(envs),
            "next_done": np.zeros(envs, f32),
        }
        ctx = m2flow.context()
        self.batch = env_block(self.batch, shard_groups(envs, ctx.replicas)[ctx.replica])

    def trajectory(self) -> dict[str, Any]:
        return self.batch


def env_block(batch: dict[str, Any], envs: list[int]) -> dict[str, Any]:
    """The columns `envs` of a time-major batch (next_* are [envs, ...]), with their `env_ids`."""

    def take(value: Any, axis: int) -> Any:
        if isinstance(value, dict):
            return {key: take(item, axis) for key, item in value.items()}
        return np.take(value, envs, axis=axis)

    out = {key: take(value, 0 if key.startswith("next_") else 1) for key, value in batch.items()}
    return {**out, "env_ids": np.asarray(envs)}
