"""What a simulator worker keeps between `trajectory()` calls: the time-major buffer of (macro) steps
and the statistics of the episodes that ended."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np


def stack_steps(values: list[Any]) -> Any:
    """Stack a list of arrays (or of dicts of arrays) along a new leading time axis."""
    if isinstance(values[0], dict):
        return {key: np.stack([v[key] for v in values]) for key in values[0]}
    return np.stack(values)


class Recorder:
    def __init__(self, num_envs: int):
        self.buffer: dict[str, list] = defaultdict(list)
        self.episode_return = np.zeros(num_envs)
        self.episode_len = np.zeros(num_envs, dtype=np.int64)
        self.finished: list[tuple[float, int, float]] = []

    def record(self, obs: Any, began: np.ndarray, reward: np.ndarray, policy_out: dict[str, np.ndarray]) -> None:
        """One step: the observation it started from, whether that began an episode (CleanRL's `done`),
        its reward, and what the policy sent with the action (log-prob, value)."""
        self.buffer["obs"].append(obs)
        self.buffer["done"].append(began.astype(np.float32))
        self.buffer["reward"].append(reward.astype(np.float32))
        for key, value in policy_out.items():
            self.buffer[key].append(value if isinstance(value, dict) else np.asarray(value))

    def count(self, reward: np.ndarray, steps: np.ndarray | int = 1) -> None:
        self.episode_return += reward
        self.episode_len += steps

    def end_episodes(self, done: np.ndarray, success: np.ndarray | None = None) -> None:
        for i in np.flatnonzero(done):
            ok = float(success[i]) if success is not None else float("nan")
            self.finished.append((float(self.episode_return[i]), int(self.episode_len[i]), ok))
            self.episode_return[i], self.episode_len[i] = 0.0, 0

    def trajectory(self, next_obs: Any, next_done: np.ndarray, env_ids: np.ndarray) -> dict[str, Any]:
        batch = {key: stack_steps(values) for key, values in self.buffer.items() if values}
        batch.update(next_obs=next_obs, next_done=next_done.astype(np.float32).copy(), env_ids=env_ids.copy())
        self.buffer = defaultdict(list)
        return batch

    def metrics(self) -> dict[str, float]:
        """Completed-episode statistics since the last call (absent if no episode ended)."""
        if not self.finished:
            return {}
        returns, lengths, success = (np.array(x, dtype=np.float64) for x in zip(*self.finished, strict=True))
        self.finished = []
        out = {
            "env/episode_return": float(returns.mean()),
            "env/episode_len": float(lengths.mean()),
            "env/episodes": float(len(returns)),
        }
        if not np.isnan(success).all():
            out["env/success_rate"] = float(np.nanmean(success))
        return out

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"episode_return": self.episode_return.copy(), "episode_len": self.episode_len.copy()}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        self.episode_return = np.array(state["episode_return"])
        self.episode_len = np.array(state["episode_len"])
