"""Shared fixtures: one real local Ray cluster per test session (ray.init costs seconds here)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# configs sized for a GPU machine, and how they are shrunk to run (and plan) on this CPU machine
SMALL_VIT = ["workers.rollout.args.size=1m", "workers.actor.args.size=1m", "workers.env.args.num_envs=16"]
ON_CPU = {"ppo_camera_gpu.yaml": SMALL_VIT, "ppo_camera_gpu_async.yaml": SMALL_VIT}
os.environ.setdefault("MUJOCO_GL", "egl")
# runs measure and cache port costs (`planners/cache.py`): the tests never read or write the user's cache
COST_CACHE = os.environ["M2FLOW_COST_CACHE"] = tempfile.mkdtemp(prefix="m2flow-test-costs-")


def pytest_unconfigure(config):
    """The session's cost cache goes with it."""
    shutil.rmtree(COST_CACHE, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    """`gpu` tests need CUDA: skipped (with the reason) where there is none, as on CI."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (run on the GPU machine: pytest -m gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    if not ray.is_initialized():
        os.environ.setdefault("RAY_worker_niceness", "0")  # as connect_ray: workers at the tests' priority
        ray.init(address="local", num_cpus=2, num_gpus=0, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture
def config_path() -> Path:
    return ROOT / "configs" / "ppo_mujoco.yaml"
