"""Envs that name themselves when they fail, so the runtime can tell which env keeps crashing its replica
and quarantine it (`m2flow.EnvFailed`, `run.quarantine_after`)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym

import m2flow


class NamedFailures(gym.Wrapper):
    """`env`, whose reset or step raising becomes `m2flow.EnvFailed` naming its global index `index` (the
    original error chained, so its traceback is kept)."""

    def __init__(self, env: gym.Env, index: int):
        super().__init__(env)
        self.index = index

    def reset(self, **kwargs: Any) -> Any:
        try:
            return self.env.reset(**kwargs)
        except Exception as exc:
            raise m2flow.EnvFailed(self.index, f"reset raised {type(exc).__name__}: {exc}") from exc

    def step(self, action: Any) -> Any:
        try:
            return self.env.step(action)
        except Exception as exc:
            raise m2flow.EnvFailed(self.index, f"step raised {type(exc).__name__}: {exc}") from exc
