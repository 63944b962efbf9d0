"""Observation and action sizes of a task, for building and sizing a policy. Known tasks come from a small
table (checked against the real envs by tests/unit/test_spaces.py), so a dry run builds no env and imports
no simulator; any other task, or other `env_kwargs`, is read from a throwaway instance."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class KnownTask:
    env_id: str
    obs_dim: int  # the flat observation (the state; proprioception beside camera images)
    act_dim: int
    env_kwargs: dict[str, Any] = field(default_factory=dict)


KNOWN_TASKS = (
    KnownTask("HalfCheetah-v5", 17, 6),
    KnownTask("Hopper-v5", 11, 3),
    KnownTask("Walker2d-v5", 17, 6),
    KnownTask("Ant-v5", 105, 8),
    KnownTask("Humanoid-v5", 348, 17),
    KnownTask("InvertedPendulum-v5", 4, 1),
    KnownTask("Meta-World/MT1", 39, 4, {"env_name": "reach-v3"}),
)


def known_task(env_id: str, env_kwargs: dict[str, Any] | None = None) -> KnownTask | None:
    """The table's entry for this task with exactly these kwargs, or None."""
    return next((t for t in KNOWN_TASKS if t.env_id == env_id and t.env_kwargs == (env_kwargs or {})), None)


def env_dims(env_id: str, **env_kwargs: Any) -> tuple[int, int]:
    """Observation and action sizes: from the table, else read from a throwaway instance of the env."""
    task = known_task(env_id, env_kwargs)
    if task is not None:
        return task.obs_dim, task.act_dim
    import numpy as np

    from m2flow.workers.env.env_ids import make_env

    env = make_env(env_id, **env_kwargs)
    try:
        return int(np.prod(env.observation_space.shape)), int(np.prod(env.action_space.shape))
    finally:
        env.close()
