"""Planning on a machine with GPUs: devices typed by kind (a simulator on a GPU machine's cores is on cpuN), GPU
memory, the simulators' rendering GPU, a training worker too large for one; device references across processes."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import pytest

from m2flow.cluster import Cluster, DeviceId
from m2flow.errors import PlanError
from m2flow.graph import build_graph
from m2flow.planners import make_plan
from m2flow.schedule import Plan
from tests.unit.test_planner import plan_of, workflow


def test_cpu_replicas_on_a_machine_with_gpus_are_named_and_counted_as_cpus():
    """Placements hold typed devices: a simulator on the CPUs of a GPU machine is on cpuN, never on a GPU."""
    raw = workflow(stages=1, env_replicas=4, mode="shared")
    raw["cluster"] = {"gpus": 1, "cpus": 16}
    plan = plan_of(raw)
    env = plan.placements["env"].replica_devices
    assert env == [DeviceId(0, "cpu", i) for i in range(4)]
    assert plan.placements["policy"].replica_devices == [DeviceId(0, "gpu", 0)]
    assert not {"policy", "learner"} & {w for pair in plan.sharing() for w in pair if "env" in pair}
    gpu_tasks = {t.worker for t in plan.tasks if t.device.kind == "gpu"}
    assert gpu_tasks == {"policy", "learner"}
    assert Plan.from_dict(plan.to_dict()).placements["env"].replica_devices == env


def test_gpu_memory_is_the_spec_s_else_the_smallest_local_gpu_s_else_80(tmp_path, monkeypatch):
    from m2flow.cluster import DEFAULT_GPU_MEMORY_GB, gpu_memory_gb
    from m2flow.spec import ClusterSpec

    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi here
    assert gpu_memory_gb(ClusterSpec()) == DEFAULT_GPU_MEMORY_GB == 80
    smi = tmp_path / "nvidia-smi"  # what nvidia-smi prints for an H200 and an 80 GB GPU (MiB)
    smi.write_text("#!/bin/sh\nprintf '143771\\n81559\\n'\n")
    smi.chmod(0o755)
    assert gpu_memory_gb(ClusterSpec()) == pytest.approx(81559 / 1024)
    assert gpu_memory_gb(ClusterSpec(gpu_memory_gb=24)) == 24


def camera_plan(gpus: int, mode: str, config: str = "ppo_camera.yaml"):
    from m2flow.config import load_spec
    from tests.conftest import ROOT

    overrides = [f"cluster.gpus={gpus}", "cluster.cpus=8", "cluster.gpu_memory_gb=80", f"placement.mode={mode}"]
    spec = load_spec(ROOT / "configs" / config, [*overrides, "placement.pipeline_stages=1"])
    graph = build_graph(spec)
    return graph, make_plan(graph, Cluster.from_spec(spec.cluster))


def test_a_training_worker_that_does_not_fit_is_told_which_of_its_args_lowers_its_memory():
    from m2flow.config import load_spec
    from tests.conftest import ROOT

    vit = ["model=vit", "size=300m", "patch=12", "precision=bf16"]  # session 36's first H100 call: 95 GB wanted
    overrides = ["cluster.gpus=1", "cluster.cpus=16", "cluster.gpu_memory_gb=80", "placement.mode=shared"]
    policies = ("env.args.evaluation.policy", "rollout.args", "actor.args")  # every worker the weights reach
    overrides += [f"workers.{key}.{a}" for key in policies for a in vit]
    overrides += ["workers.env.replicas=12", "workers.env.args.num_envs=16", "flow.loop.horizon=64"]
    overrides += ["workers.actor.args.num_minibatches=6"]
    spec = load_spec(ROOT / "configs/ppo_camera.yaml", overrides)
    with pytest.raises(PlanError) as refused:
        make_plan(build_graph(spec), Cluster.from_spec(spec.cluster))
    assert "workers.actor: a minibatch of 2048 samples keeps" in str(refused.value)
    assert "raise args.num_minibatches (now 6) or set args.activation_checkpointing: true" in str(refused.value)
    spec = load_spec(ROOT / "configs/ppo_camera.yaml", [*overrides, "workers.actor.args.num_minibatches=24"])
    assert make_plan(build_graph(spec), Cluster.from_spec(spec.cluster)).mode == "shared"  # as the advice said


def test_simulators_render_on_the_gpus_no_inference_replica_uses_and_the_plan_says_so_where_they_have_cameras():
    from m2flow.planners.render import render_gpus

    graph, plan = camera_plan(gpus=2, mode="disaggregated")
    acting = {d.name for d in plan.placements["rollout"].replica_devices}
    chosen = render_gpus(graph, plan)
    assert len(chosen) == len(plan.placements["env"].replica_devices) and {r.worker for r in chosen} == {"env"}
    assert {gpu.name for gpu in chosen.values()} == {"n0/gpu0", "n0/gpu1"} - acting
    assert any(
        note.startswith("render: env's cameras (EGL) on") and "no loop worker uses" in note for note in plan.notes
    )
    graph, plan = camera_plan(gpus=1, mode="shared")  # one GPU: rendering shares it, and the plan says so
    assert {gpu.name for gpu in render_gpus(graph, plan).values()} == {"n0/gpu0"}
    assert any("shared with the loop's GPU workers" in note for note in plan.notes)
    graph, plan = camera_plan(gpus=0, mode="shared")  # no GPU: nothing to choose
    assert not render_gpus(graph, plan) and not any(note.startswith("render:") for note in plan.notes)
    graph, plan = camera_plan(gpus=1, mode="shared", config="ppo_mujoco.yaml")  # a GymEnv: no cameras, no note
    assert render_gpus(graph, plan) and not any(note.startswith("render:") for note in plan.notes)


def test_a_device_pickled_into_another_process_finds_its_entry_there():
    # its hash is kept on it: another process (another string hash seed) must compute its own
    script = (
        "import pickle, sys; from m2flow.cluster import DeviceId;"
        " device = pickle.loads(sys.stdin.buffer.read());"
        " print({DeviceId(1, 'gpu', 3): 'found'}.get(device, 'lost'), hash(device) == hash((1, 'gpu', 3)))"
    )
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"  # not this process's seed
    env = {**os.environ, "PYTHONHASHSEED": seed}
    out = subprocess.run(
        [sys.executable, "-c", script], input=pickle.dumps(DeviceId(1, "gpu", 3)), env=env, capture_output=True
    )
    assert out.stdout.decode().split() == ["found", "True"], out.stderr.decode()


def test_a_device_pickled_before_it_kept_its_hash_gets_one_when_loaded():
    device = DeviceId.__new__(DeviceId)
    device.__setstate__({"node": 1, "kind": "gpu", "index": 3})  # what loading such a pickle does
    assert device == DeviceId(1, "gpu", 3) and {DeviceId(1, "gpu", 3): "found"}.get(device) == "found"
