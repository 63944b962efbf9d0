"""Envs that name themselves when they fail, so the runtime can tell which env keeps crashing its replica
and quarantine it (`run.quarantine_after`): by raising `m2flow.EnvFailed`, or, should the process crash
inside the env (a segfault in the physics engine), through the env it noted it was working on
(`WorkerContext.working_on`)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym

import m2flow


class NamedFailures(gym.Wrapper):
    """`env`, whose reset or step raising becomes `m2flow.EnvFailed` naming its global index `index` (the
    original error chained, so its traceback is kept), and in whose reset, step or render a crash of the
    process counts against that index."""

    def __init__(self, env: gym.Env, index: int):
        super().__init__(env)
        self.index = index
        self.working = m2flow.context().working_on(index)  # `with env.working:` around its own renderer's calls

    def reset(self, **kwargs: Any) -> Any:
        with self.working:
            try:
                return self.env.reset(**kwargs)
            except Exception as exc:
                raise m2flow.EnvFailed(self.index, f"reset raised {type(exc).__name__}: {exc}") from exc

    def step(self, action: Any) -> Any:
        with self.working:
            try:
                return self.env.step(action)
            except Exception as exc:
                raise m2flow.EnvFailed(self.index, f"step raised {type(exc).__name__}: {exc}") from exc

    def render(self) -> Any:
        with self.working:
            return self.env.render()
