"""Snapshot and restore a gymnasium MuJoCo env exactly: MuJoCo's integration state, the env's RNG and
its time limit counter. Used for exact resume from checkpoints. The state is numpy (checkpoints load
numpy arrays weights-only): a simulator process needs no torch."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import mujoco
import numpy as np

_SPEC = mujoco.mjtState.mjSTATE_INTEGRATION  # time, qpos, qvel, act, warm start, controls, applied forces


def is_mujoco(env: gym.Env) -> bool:
    return hasattr(env.unwrapped, "model") and hasattr(env.unwrapped, "data")


def env_state(env: gym.Env) -> dict[str, Any]:
    inner = env.unwrapped
    physics = np.empty(mujoco.mj_stateSize(inner.model, _SPEC))
    mujoco.mj_getState(inner.model, inner.data, physics, _SPEC)
    limit = time_limit(env)
    return {
        "physics": physics,
        "rng": inner.np_random.bit_generator.state,
        "elapsed": limit._elapsed_steps if limit is not None else 0,
    }


def set_env_state(env: gym.Env, saved: dict[str, Any]) -> None:
    inner = env.unwrapped
    physics = np.array(saved["physics"], dtype=np.float64)
    mujoco.mj_setState(inner.model, inner.data, physics, _SPEC)
    mujoco.mj_forward(inner.model, inner.data)  # positions, contacts, ... of the restored state
    mujoco.mj_setState(inner.model, inner.data, physics, _SPEC)  # and its warm start, which the solver rewrote
    inner.np_random.bit_generator.state = saved["rng"]
    limit = time_limit(env)
    if limit is not None:
        limit._elapsed_steps = saved["elapsed"]


def time_limit(env: gym.Env) -> gym.wrappers.TimeLimit | None:
    while not isinstance(env, gym.wrappers.TimeLimit):
        if not hasattr(env, "env"):
            return None
        env = env.env
    return env


def simulator_state(envs: list[gym.Env], recorder: Any, **arrays: np.ndarray) -> dict[str, Any]:
    """A simulator worker's resumable state: each env's physics and RNG, its pending `arrays` (the next
    observations, done flags) and the episode statistics so far."""
    return {
        "envs": [env_state(env) for env in envs],
        "arrays": {key: np.array(value) for key, value in arrays.items()},
        "episodes": recorder.state_dict(),
    }


def resliced_states(states: list[dict[str, Any]], parts: int) -> list[dict[str, Any]]:
    """The states `simulator_state` saved of a replica's slices (its envs in order, cut into `len(states)`
    contiguous slices) cut into `parts` slices instead: what its instances load after a switch to a plan with
    another number of pipeline stages. Every entry is per env (physics, pending arrays, statistics, episodes)."""
    from m2flow.sharding import slice_sizes

    if not all(states):  # saved before the first observation: nothing to carry
        return [{} for _ in range(parts)]
    envs = [env for state in states for env in state["envs"]]
    arrays = {key: np.concatenate([state["arrays"][key] for state in states]) for key in states[0]["arrays"]}
    episodes = {key: np.concatenate([state["episodes"][key] for state in states]) for key in states[0]["episodes"]}
    cut, start = [], 0
    for size in slice_sizes(len(envs), parts):
        part = slice(start, start + size)
        cut.append(
            {
                "envs": envs[part],
                "arrays": {key: value[part] for key, value in arrays.items()},
                "episodes": {key: value[part] for key, value in episodes.items()},
            }
        )
        start += size
    return cut


def load_simulator_state(envs: list[gym.Env], recorder: Any, state: dict[str, Any]) -> dict[str, np.ndarray]:
    """Restore what `simulator_state` saved into the envs and the recorder; returns the pending arrays."""
    for env, saved in zip(envs, state["envs"], strict=True):
        set_env_state(env, saved)
    recorder.load_state_dict(state["episodes"])
    return {key: np.array(value) for key, value in state["arrays"].items()}
