"""Observation and action sizes of a task, for building and sizing a policy, and its cameras' names. Known tasks
come from a small table (checked against the real envs by tests/unit/test_spaces.py), so a dry run builds no env
and imports no simulator; any other task, or other `env_kwargs`, is read from a throwaway instance (its cameras are
then checked as the env is built)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from m2flow.errors import did_you_mean


@dataclass(frozen=True)
class KnownTask:
    env_id: str
    obs_dim: int  # the flat observation (the state; proprioception beside camera images)
    act_dim: int
    cameras: tuple[str, ...]  # the model's named cameras
    env_kwargs: dict[str, Any] = field(default_factory=dict)


METAWORLD_CAMERAS = ("topview", "corner", "corner2", "corner3", "corner4", "behindGripper", "gripperPOV")
KNOWN_TASKS = (
    KnownTask("HalfCheetah-v5", 17, 6, ("track",)),
    KnownTask("Hopper-v5", 11, 3, ("track",)),
    KnownTask("Walker2d-v5", 17, 6, ("track",)),
    KnownTask("Ant-v5", 105, 8, ("track",)),
    KnownTask("Humanoid-v5", 348, 17, ("track",)),
    KnownTask("InvertedPendulum-v5", 4, 1, ()),
    KnownTask("Meta-World/MT1", 39, 4, METAWORLD_CAMERAS, {"env_name": "reach-v3"}),
)


def known_task(env_id: str, env_kwargs: dict[str, Any] | None = None) -> KnownTask | None:
    """The table's entry for this task with exactly these kwargs, or None."""
    return next((t for t in KNOWN_TASKS if t.env_id == env_id and t.env_kwargs == (env_kwargs or {})), None)


def camera_refusal(env_id: str, env_kwargs: dict[str, Any], key: str, names: list[str]) -> str | None:
    """Why `names` (given at `key`) cannot be rendered: a camera the known task's model lacks; None where all are
    there or the task is not in the table."""
    task = known_task(env_id, env_kwargs)
    missing = [name for name in names if task is not None and name not in task.cameras]
    if not missing:
        return None
    has = f"its cameras: {', '.join(task.cameras)}" if task.cameras else "it has no named camera"
    return f"{key}: {env_id} has no camera '{missing[0]}' ({has}){did_you_mean(missing[0], task.cameras)}"


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
