"""Auto's allocation of the camera job on 8 GPUs and 64 CPUs against RLinf-style hand layouts of it
(`benchmarks/planner.py`): no hand layout is predicted faster, and every device auto leaves idle is named."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from planner import ALLOCATED, HAND_LAYOUTS, plan_camera_job  # noqa: E402

from m2flow.cluster import Cluster  # noqa: E402
from m2flow.config import load_spec  # noqa: E402
from m2flow.graph import build_graph  # noqa: E402
from m2flow.planners import make_plan  # noqa: E402
from m2flow.planners.render import camera_gpus  # noqa: E402
from tests.conftest import ROOT  # noqa: E402


def test_no_hand_layout_of_the_camera_job_is_predicted_faster_than_auto_choosing_the_replica_counts():
    auto = plan_camera_job(*ALLOCATED)
    hand = {layout.name: plan_camera_job(*layout.overrides()) for layout in HAND_LAYOUTS}
    assert all(plan.mode.startswith("manual") for plan in hand.values())
    for name, plan in hand.items():
        assert auto.predicted.iteration_s <= plan.predicted.iteration_s, name
    # the hand layouts differ: the comparison is not with one plan five times over
    assert len({round(plan.predicted.iteration_s, 6) for plan in hand.values()}) >= 4


def test_auto_uses_every_gpu_of_the_camera_job_and_names_the_idle_cores_with_the_reason():
    plan = plan_camera_job(*ALLOCATED)
    used = plan.occupants()
    idle = [d for d in plan.cluster.devices if d not in used]
    assert all(d.kind == "cpu" for d in idle)  # all 8 GPUs host inference and training replicas
    notes = [n for n in plan.notes if n.startswith("left idle:")]
    assert len(notes) == 1 and f"left idle: {len(idle)} cpu(s)" in notes[0]
    assert "more replicas of env were predicted no faster" in notes[0]


def test_the_gpus_the_cameras_render_on_are_not_named_idle():
    """`m2flow plan configs/ppo_camera.yaml cluster.gpus=8 cluster.cpus=64`: the policy and the trainer take a GPU
    each and the simulators' cameras render on GPUs the policy does not use, some on GPUs of their own: only the
    GPUs left after those are named idle."""
    graph = build_graph(load_spec(ROOT / "configs" / "ppo_camera.yaml", ["cluster.gpus=8", "cluster.cpus=64"]))
    plan = make_plan(graph, Cluster.from_spec(graph.spec.cluster))
    rendering = camera_gpus(graph, plan)
    assert rendering - set(plan.occupants())  # GPUs used for rendering alone
    (gpus_idle,) = [n for n in plan.notes if n.startswith("left idle:") and "gpu(s)" in n]
    idle = set(plan.cluster.of_kind("gpu")) - set(plan.occupants()) - rendering
    assert f"left idle: {len(idle)} gpu(s)" in gpus_idle
    assert not any(gpu.name in gpus_idle for gpu in rendering)
