"""BEHAVIOR / OmniGibson (Isaac Sim) as a simulator worker, with the BEHAVIOR study's optimisations as config.

NOT RUN against the real simulator: Isaac Sim cannot be installed where m2flow is developed, so this
adapter's own logic (slicing, flags, physics frequency, action/observation mapping) is tested against a
stand-in module. Install with `pip install m2flow[behavior]` on a machine that meets Isaac Sim's needs.

OmniGibson runs one simulator per process and one physics call advances every env in it. So a replica's
pipeline slices share one vector environment: a slice's `step` sets its own envs' actions (the others
keep theirs) and advances the physics by 1/S of a policy step, so that simulated time per policy step
is the configured one whatever the number of slices S.
"""

from __future__ import annotations

import inspect
import os
from typing import Any, Literal

import numpy as np
from pydantic import Field

import m2flow
from m2flow.errors import MissingDependency
from m2flow.workers.env.recording import Recorder

INSTALL = (
    "OmniGibson is not installed: pip install 'm2flow[behavior]' on a Linux machine with an NVIDIA RTX-class"
    " GPU and driver that Isaac Sim supports (see OmniGibson's install guide); Isaac Sim cannot run here"
)

R1PRO_CAMERAS = {  # camera -> OmniGibson sensor prefix on the R1 Pro
    "head": "robot_r1::robot_r1:zed_link:Camera:0",
    "left_wrist": "robot_r1::robot_r1:left_realsense_link:Camera:0",
    "right_wrist": "robot_r1::robot_r1:right_realsense_link:Camera:0",
}
OG_MODALITY = {"rgb": "rgb", "depth": "depth_linear", "segmentation": "seg_instance"}


class BehaviorConfig(m2flow.WorkerConfig):
    items_field = "num_envs"

    task: str = Field("turning_on_radio", description="the BEHAVIOR activity (OmniGibson's activity_name)")
    num_envs: int = Field(1, ge=1, description="envs per replica, cut across pipeline slices")
    robot: str = Field("R1Pro", description="OmniGibson's robot type")
    action_dim: int = Field(23, ge=1, description="the robot's action size")
    cameras: list[Literal["head", "left_wrist", "right_wrist"]] = Field(
        default_factory=lambda: ["head", "left_wrist", "right_wrist"], description="the sensors rendered"
    )
    modalities: list[Literal["rgb", "depth", "segmentation", "proprio"]] = Field(
        default_factory=lambda: ["rgb"], description="what each camera observes (and proprio: the robot's state)"
    )
    size: tuple[int, int] = Field((224, 224), description="image height and width")
    chunk: int = Field(1, ge=1, description="actions per policy call (an action chunk)")
    action_frequency: float = Field(30.0, gt=0, description="policy steps per simulated second")
    physics_frequency: float = Field(120.0, gt=0, description="physics steps per simulated second")
    viewport: bool = Field(False, description="keep OmniGibson's viewer (off: no viewport rendered)")
    threads: int = Field(1, ge=1, description="CPU threads for the simulator's own pools")
    numba_cache_dir: str = Field("/tmp/m2flow-numba-cache", description="numba's compiled-code cache, kept across runs")


def process_environment(cfg: BehaviorConfig) -> dict[str, str]:
    """Set before OmniGibson is imported: headless, bounded thread pools, a persistent numba cache."""
    threads = str(cfg.threads)
    return {
        "OMNIGIBSON_HEADLESS": "1",
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "NUMBA_NUM_THREADS": threads,
        "NUMBA_CACHE_DIR": cfg.numba_cache_dir,
    }


def omnigibson_config(cfg: BehaviorConfig, num_envs: int, stages: int) -> dict[str, Any]:
    """The OmniGibson config: only the sensors and modalities the policy reads, no viewport, and the
    action frequency scaled by the number of slices (each slice's call advances 1/S of a policy step)."""
    image_modalities = [OG_MODALITY[m] for m in cfg.modalities if m in OG_MODALITY]
    return {
        "env": {
            "num_envs": num_envs,
            "action_frequency": cfg.action_frequency * stages,
            "physics_frequency": max(cfg.physics_frequency, cfg.action_frequency * stages),
            "rendering_frequency": cfg.action_frequency * stages,
            "external_sensors": None,
        },
        "render": {"viewer_width": 0, "viewer_height": 0} if not cfg.viewport else {},
        "robots": [
            {
                "type": cfg.robot,
                "obs_modalities": image_modalities + (["proprio"] if "proprio" in cfg.modalities else []),
                "sensor_config": {
                    "VisionSensor": {"sensor_kwargs": {"image_height": cfg.size[0], "image_width": cfg.size[1]}}
                },
                "include_sensor_names": [R1PRO_CAMERAS[c] for c in cfg.cameras],
            }
        ],
        "task": {"type": "BehaviorTask", "activity_name": cfg.task},
    }


_SHARED: dict[tuple, Any] = {}  # (replica env range, stages) -> the process's vector environment


def _vector_env(cfg: BehaviorConfig, replica_items: tuple[int, int], stages: int) -> Any:
    key = (replica_items, stages)
    if key not in _SHARED:
        os.environ.update(process_environment(cfg))
        try:
            from omnigibson.envs import VectorEnvironment
        except ImportError:
            raise MissingDependency(INSTALL) from None
        num_envs = replica_items[1] - replica_items[0]
        _SHARED[key] = VectorEnvironment(num_envs, omnigibson_config(cfg, num_envs, stages))
    return _SHARED[key]


class BehaviorEnv:
    Config = BehaviorConfig
    rendering_ports = frozenset({"obs", "step"})  # Isaac Sim renders its sensors on the node's GPU

    def __init__(self, **args: Any):
        self.config = BehaviorConfig(**args)
        ctx = m2flow.context()
        self.vec = _vector_env(self.config, ctx.replica_items, ctx.stages)
        first = ctx.replica_items[0]
        self.rows = np.arange(ctx.items[0] - first, ctx.items[1] - first)  # this slice's envs in the vector env
        self.env_ids = np.arange(*ctx.items)
        self.lazy_obs = "get_obs" in inspect.signature(self.vec.step).parameters
        if not hasattr(self.vec, "last_actions"):
            self.vec.last_actions = np.zeros((self.vec.num_envs, self.config.action_dim), np.float32)
        self.recorder = Recorder(len(self.rows))
        self._observation: dict[str, np.ndarray] | None = None
        self._done = np.zeros(len(self.rows), dtype=bool)

    def obs(self) -> dict[str, np.ndarray]:
        if self._observation is None:
            raw, _ = self.vec.reset()
            self._observation = self.map_observations(raw)
        return self._observation

    def step(self, policy_out: dict[str, np.ndarray] | np.ndarray) -> dict[str, np.ndarray]:
        out = policy_out if isinstance(policy_out, dict) else {"action": policy_out}
        chunk = np.clip(
            np.asarray(out["action"], np.float32).reshape(len(self.rows), -1, self.config.action_dim), -1.0, 1.0
        )
        started_from, began = self.obs(), self._done.copy()
        reward, done = np.zeros(len(self.rows)), np.zeros(len(self.rows), dtype=bool)
        raw = None
        for c in range(chunk.shape[1]):
            self.vec.last_actions[self.rows] = np.where(done[:, None], self.vec.last_actions[self.rows], chunk[:, c])
            last = c == chunk.shape[1] - 1
            kwargs = {"get_obs": last, "render": last} if self.lazy_obs else {}
            raw, rewards, terminated, truncated, _ = self.vec.step(list(self.vec.last_actions), **kwargs)
            live = ~done
            reward[live] += np.asarray(rewards, dtype=np.float64)[self.rows][live]
            done |= (np.asarray(terminated) | np.asarray(truncated))[self.rows]
        self.recorder.record(started_from, began, reward, out)
        self.recorder.count(reward, chunk.shape[1])
        self.recorder.end_episodes(done)
        self._done = done
        self._observation = self.map_observations(raw)
        return self._observation

    def map_observations(self, raw: list[dict[str, Any]]) -> dict[str, np.ndarray]:
        """OmniGibson's per-env dicts keyed by sensor -> m2flow's {modality: [envs, cameras, h, w, ...]}."""
        out: dict[str, np.ndarray] = {}
        for modality in self.config.modalities:
            if modality == "proprio":
                out["proprio"] = np.stack([np.asarray(raw[r]["robot_r1::proprio"], np.float32) for r in self.rows])
                continue
            key = OG_MODALITY[modality]
            out[modality] = np.stack(
                [
                    np.stack(
                        [
                            np.asarray(raw[r][f"{R1PRO_CAMERAS[c]}::{key}"])[..., :3]
                            if modality == "rgb"
                            else np.asarray(raw[r][f"{R1PRO_CAMERAS[c]}::{key}"])
                            for c in self.config.cameras
                        ]
                    )
                    for r in self.rows
                ]
            )
        out["env_id"] = self.env_ids
        return out

    def trajectory(self) -> dict[str, Any]:
        return self.recorder.trajectory(self.obs(), self._done, self.env_ids)

    def metrics(self) -> dict[str, float]:
        return self.recorder.metrics()
