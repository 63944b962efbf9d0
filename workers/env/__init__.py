"""Simulator workers."""

from m2flow.workers.env.camera_env import CameraEnv, CameraEnvConfig, CameraObservation
from m2flow.workers.env.gym_env import GymEnv, GymEnvConfig

__all__ = ["CameraEnv", "CameraEnvConfig", "CameraObservation", "GymEnv", "GymEnvConfig"]
