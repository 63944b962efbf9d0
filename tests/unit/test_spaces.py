"""The table of known tasks' sizes and cameras (what a dry run reads instead of building an env) matches the real
envs."""

from __future__ import annotations

import numpy as np
import pytest

from m2flow.workers.env.env_ids import make_env
from m2flow.workers.env.spaces import KNOWN_TASKS, env_dims


@pytest.mark.parametrize("task", KNOWN_TASKS, ids=lambda t: f"{t.env_id}{t.env_kwargs or ''}")
def test_known_task_sizes_match_the_real_env(task):
    env = make_env(task.env_id, **task.env_kwargs)
    try:
        assert (task.obs_dim, task.act_dim) == (
            int(np.prod(env.observation_space.shape)),
            int(np.prod(env.action_space.shape)),
        )
    finally:
        env.close()


@pytest.mark.parametrize("task", KNOWN_TASKS, ids=lambda t: f"{t.env_id}{t.env_kwargs or ''}")
def test_known_task_cameras_are_the_named_cameras_of_the_real_model(task):
    env = make_env(task.env_id, **task.env_kwargs)
    try:
        model = env.unwrapped.model
        named = tuple(model.camera(i).name for i in range(model.ncam) if model.camera(i).name)
        assert task.cameras == named
    finally:
        env.close()


def test_other_kwargs_read_the_real_env():
    assert env_dims("HalfCheetah-v5", exclude_current_positions_from_observation=False) == (18, 6)
