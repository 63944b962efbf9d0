"""Placement, pipeline slices and slices merged into one policy call change the schedule, never the results:
every mode and S equal shared S=1, and merged calls the same plan's slice-by-slice calls, env by env."""

from __future__ import annotations

import json

import numpy as np
import pytest

import m2flow as mf
from m2flow.config import spec_from_dict

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_cluster")]


def rollout_workflow(
    tmp_path,
    name: str,
    stages: int,
    mode: str,
    colocate: bool = False,
    merge: bool | str = "auto",
    policy: str = "SavingPolicy",
) -> mf.WorkflowSpec:
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
                "rollout": {"kind": "inference", "class": f"tests.workers_for_tests.{policy}", "args": env},
            },
            "flow": {
                "loop": {"horizon": 64, "edges": ["env.obs -> rollout.act", "rollout.act -> env.step"]},
                "then": ["env.trajectory -> rollout.train"],
            },
            "placement": {"mode": mode, "pipeline_stages": stages, "colocate": colocate, "merge_slices": merge},
            "run": {"iterations": 2, "seed": 5, "output_dir": str(tmp_path), "progress": False, "checkpoint_every": 0},
        }
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One slice, everything shared: the batches every other schedule must reproduce."""
    return mf.run(rollout_workflow(tmp_path_factory.mktemp("reference"), "s1", 1, "shared"))


@pytest.mark.parametrize(
    ("mode", "stages", "colocate"),
    [
        ("hybrid", 2, False),
        ("hybrid", 4, False),  # 2 envs per policy call
        ("disaggregated", 1, False),
        ("auto", "auto", False),
        ("shared", 1, True),  # env[0] and rollout[0] in one process, env[1] on a channel
        ("shared", 2, True),
    ],
)
def test_every_mode_and_slicing_gives_the_same_trajectories_env_by_env(tmp_path, reference, mode, stages, colocate):
    other = mf.run(rollout_workflow(tmp_path, f"{mode}-{stages}-{colocate}", stages, mode, colocate))
    if stages != "auto":
        assert (other.plan.mode, other.plan.pipeline_stages) == (mode, stages)
    if colocate:
        assert other.plan.processes == [[("env", 0), ("rollout", 0)]]
        assert other.pids["env[0]"] == other.pids["rollout[0]"] != other.pids["env[1]"]
    for it in range(2):
        a = np.load(reference.run_dir / f"batch_{it}.npz")
        b = np.load(other.run_dir / f"batch_{it}.npz")
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


def test_slices_merged_into_one_policy_call_give_the_trajectories_of_the_same_plan_calling_slice_by_slice(tmp_path):
    runs = {
        merge: mf.run(rollout_workflow(tmp_path, f"merge-{merge}", 4, "hybrid", merge=merge, policy="SlowSavingPolicy"))
        for merge in (True, False)
    }
    assert runs[True].plan.merge_slices == ["rollout.act"] and runs[False].plan.merge_slices == []
    for merge, run in runs.items():
        events = json.loads((run.run_dir / "trace.json").read_text())["traceEvents"]
        acts = [e["args"]["items"] for e in events if e.get("cat") == "loop" and e["name"] == "act"]
        assert set(acts) <= {2, 4, 6, 8}  # 1 env a slice from each of the 2 simulators; merged calls take more
        assert (max(acts) > 2) == merge
    for it in range(2):
        a = np.load(runs[False].run_dir / f"batch_{it}.npz")
        b = np.load(runs[True].run_dir / f"batch_{it}.npz")
        assert a["env_ids"].tolist() == b["env_ids"].tolist() == list(range(8))
        for key in ("obs", "action", "reward"):
            np.testing.assert_array_equal(a[key], b[key], err_msg=f"{key}, iteration {it}")
