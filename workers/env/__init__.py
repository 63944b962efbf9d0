"""Simulator workers."""

from m2flow.workers.env.gym_env import GymEnv, GymEnvConfig

__all__ = ["GymEnv", "GymEnvConfig"]
