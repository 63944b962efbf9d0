"""Pipeline slices change the schedule, never the results: S=2 equals S=1 env by env."""

from __future__ import annotations

import numpy as np
import pytest

import m2flow as mf
from m2flow.config import spec_from_dict

pytestmark = pytest.mark.usefixtures("ray_cluster")


def rollout_workflow(tmp_path, name: str, stages: int, mode: str) -> mf.WorkflowSpec:
    env = {"env_id": "HalfCheetah-v5"}
    return spec_from_dict(
        {
            "name": name,
            "workers": {
                "env": {
                    "kind": "simulator",
                    "class": "m2flow.workers.env.GymEnv",
                    "replicas": 2,
                    "args": {**env, "num_envs": 4},
                },
                "rollout": {"kind": "inference", "class": "m2flow.workers.rollout.TorchPolicy", "args": env},
                "sink": {"kind": "function", "class": "tests.workers_for_tests.SaveBatch"},
            },
            "flow": {
                "loop": {"horizon": 64, "edges": ["env.obs -> rollout.act", "rollout.act -> env.step"]},
                "then": ["env.trajectory -> sink.train"],
            },
            "placement": {"mode": mode, "pipeline_stages": stages},
            "run": {"iterations": 2, "seed": 5, "output_dir": str(tmp_path), "progress": False, "checkpoint_every": 0},
        }
    )


def test_two_slices_give_the_same_trajectories_env_by_env(tmp_path):
    one = mf.run(rollout_workflow(tmp_path, "s1", 1, "shared"))
    two = mf.run(rollout_workflow(tmp_path, "s2", 2, "hybrid"))
    assert two.plan.pipeline_stages == 2
    for it in range(2):
        a = np.load(one.run_dir / f"batch_{it}.npz")
        b = np.load(two.run_dir / f"batch_{it}.npz")
        assert a["env_ids"].tolist() == b["env_ids"].tolist() == list(range(8))
        for key in ("obs", "action", "reward"):
            np.testing.assert_array_equal(a[key], b[key], err_msg=f"{key}, iteration {it}")


def test_resume_reproduces_the_next_iteration_batch(tmp_path):
    def spec(name, iterations, resume=False):
        raw = rollout_workflow(tmp_path, name, 1, "shared").to_dict()
        raw["run"].update(iterations=iterations, resume=resume, checkpoint_every=1)
        return spec_from_dict(raw)

    clean = mf.run(spec("clean", 3))
    mf.run(spec("stopped", 2))
    resumed = mf.run(spec("stopped", 3, resume=True))
    assert [h["iteration"] for h in resumed.history] == [2]
    a = np.load(clean.run_dir / "batch_2.npz")
    b = np.load(resumed.run_dir / "batch_2.npz")
    for key in ("obs", "action", "reward"):
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
