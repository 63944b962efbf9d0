"""Simulator workers. Rendering is headless: EGL when the system has it, else OSMesa (set before MuJoCo
is imported, which reads `MUJOCO_GL` once); an explicit `MUJOCO_GL` is left alone."""

import ctypes.util
import os

if "MUJOCO_GL" not in os.environ:
    for _backend, _library in (("egl", "EGL"), ("osmesa", "OSMesa")):
        if ctypes.util.find_library(_library):
            os.environ["MUJOCO_GL"] = os.environ.setdefault("PYOPENGL_PLATFORM", _backend)
            break

from m2flow.workers.env.camera_env import CameraEnv, CameraEnvConfig  # noqa: E402
from m2flow.workers.env.gym_env import GymEnv, GymEnvConfig  # noqa: E402
from m2flow.workers.env.observation import CameraObservation  # noqa: E402

__all__ = ["CameraEnv", "CameraEnvConfig", "CameraObservation", "GymEnv", "GymEnvConfig"]
