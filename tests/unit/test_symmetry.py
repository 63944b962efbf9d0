"""The loop's components that copy one another are simulated once: the same prediction and micro schedule as
simulating every replica (`planners/symmetry.py`)."""

from __future__ import annotations

import pytest

import m2flow.planners.simulation_cache as simulation_cache
from m2flow.cluster import Cluster
from m2flow.config import spec_from_dict
from m2flow.graph import build_graph
from m2flow.planners import make_plan
from m2flow.planners.symmetry import LoopClass, loop_classes
from m2flow.planners.tasklist import TaskList
from m2flow.schedule import Plan, ReplicaId


def spin_workflow(
    envs: int,
    policies: int,
    cpus: int,
    mode: str,
    stages: int = 2,
    asynchronous: bool = False,
    colocate="auto",
    trainers: int = 2,
    devices: dict | None = None,
) -> dict:
    """Spin workers with declared costs: `envs` simulator replicas of 4 envs, `policies` inference replicas,
    `trainers` training ranks; `devices` a manual layout."""
    raw = {
        "name": "copies",
        "workers": {
            "env": {
                "kind": "simulator",
                "class": "m2flow.workers.synthetic.SpinSimulator",
                "replicas": envs,
                "args": {"num_envs": 4},
                "profile": {"step": {"fixed_s": 1e-3, "per_item_s": 5e-4}},
            },
            "policy": {
                "kind": "inference",
                "class": "m2flow.workers.synthetic.SpinPolicy",
                "replicas": policies,
                "profile": {"act": {"fixed_s": 2e-3, "per_item_s": 1e-4}},
            },
            "trainer": {
                "kind": "training",
                "class": "m2flow.workers.synthetic.SpinTrainer",
                "replicas": trainers,
                "profile": {"train": {"fixed_s": 0.05, "per_item_s": 1e-5}},
            },
        },
        "flow": {
            "loop": {"horizon": 40, "edges": ["env.obs -> policy.act", "policy.act -> env.step"]},
            "then": ["env.trajectory -> trainer.train"],
            "sync": [{"edge": "trainer.weights -> policy.load_weights"}],
        },
        "placement": {"mode": mode, "pipeline_stages": stages, "merge_slices": True, "colocate": colocate},
        "cluster": {"cpus": cpus, "gpus": 0},
    }
    if asynchronous:
        raw["flow"]["async"] = {"max_staleness": 1}
    if devices:
        raw["placement"]["devices"] = devices
    return raw


def each_alone(graph, devices, together, beside_rendering) -> list[LoopClass]:
    """Every component its own class: nothing copied, every replica simulated."""
    classes = loop_classes(graph, devices, together, beside_rendering)
    return [LoopClass((c,)) for loop_class in classes for c in loop_class.components]


def plan_both_ways(raw: dict, monkeypatch) -> tuple[Plan, Plan]:
    spec = spec_from_dict(raw)
    graph, cluster = build_graph(spec), Cluster.from_spec(spec.cluster)
    copied = make_plan(graph, cluster)
    with monkeypatch.context() as patch:
        patch.setattr(simulation_cache, "loop_classes", each_alone)
        simulated = make_plan(graph, cluster)
    return copied, simulated


def schedule_of(plan: Plan) -> list[tuple]:
    """The micro schedule as comparable rows, dependencies named by what they are rather than by id."""

    def name(task) -> tuple:
        return (task.worker, task.replica, task.port, task.phase, task.step, task.stage)

    tasks = plan.tasks
    rows = [
        (*name(t), t.device.name, round(t.start, 12), round(t.end, 12), sorted(name(tasks[d]) for d in t.deps))
        for t in tasks
    ]
    return sorted(rows)


CASES = {
    "hybrid, 8 envs over 4 policies": spin_workflow(8, 4, cpus=16, mode="hybrid"),
    "disaggregated, 5 envs over 2 policies (blocks of 3 and 2)": spin_workflow(5, 2, cpus=12, mode="disaggregated"),
    "shared, co-hosted, 4 stages": spin_workflow(8, 8, cpus=8, mode="shared", stages=4, colocate=True),
    "shared, fewer policies than envs": spin_workflow(8, 2, cpus=8, mode="shared"),
    "policies placed by hand across the envs' blocks (one component)": spin_workflow(
        8, 2, cpus=8, mode="shared", devices={"env": "0-7", "policy": "0-1"}
    ),
    "hybrid, training beside the loop": spin_workflow(8, 4, cpus=12, mode="hybrid", asynchronous=True),
    "training beside the loop on a copy's device": spin_workflow(  # that device bounds the loop
        2,
        2,
        cpus=2,
        mode="shared",
        asynchronous=True,
        trainers=1,
        devices={"env": "0-1", "policy": "0-1", "trainer": "1"},
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_copying_like_components_predicts_and_schedules_what_simulating_every_replica_does(case, monkeypatch):
    copied, simulated = plan_both_ways(CASES[case], monkeypatch)
    assert (copied.mode, copied.pipeline_stages, copied.processes) == (
        simulated.mode,
        simulated.pipeline_stages,
        simulated.processes,
    )
    mine, theirs = copied.predicted, simulated.predicted
    assert mine.iteration_s == pytest.approx(theirs.iteration_s, rel=1e-12)
    assert mine.phase_s == pytest.approx(theirs.phase_s, rel=1e-12)
    assert mine.port_s == pytest.approx(theirs.port_s, rel=1e-12)
    assert mine.device_busy == pytest.approx(theirs.device_busy, rel=1e-12)
    assert mine.bubble_fraction == pytest.approx(theirs.bubble_fraction, rel=1e-12)
    assert (mine.hidden_s, mine.loop_step_s) == pytest.approx((theirs.hidden_s, theirs.loop_step_s), rel=1e-12)
    assert schedule_of(copied) == schedule_of(simulated)


def classes_of(raw: dict) -> list[LoopClass]:
    spec = spec_from_dict(raw)
    graph, cluster = build_graph(spec), Cluster.from_spec(spec.cluster)
    plan = make_plan(graph, cluster)
    devices = {w: p.replica_devices for w, p in plan.placements.items()}
    return loop_classes(graph, devices, {}, frozenset())


def test_components_that_line_up_form_one_class_and_uneven_shard_blocks_two():
    (even,) = classes_of(spin_workflow(8, 4, cpus=16, mode="hybrid"))
    assert [c.replicas for c in even.components][1] == (
        ReplicaId("env", 2),
        ReplicaId("env", 3),
        ReplicaId("policy", 1),
    )
    assert len(even.components) == 4 and len({d for c in even.components for d in c.devices}) == 12
    uneven = classes_of(spin_workflow(5, 2, cpus=12, mode="disaggregated"))
    assert [[len(c.replicas) for c in k.components] for k in uneven] == [[4], [3]]  # 3 envs + 1, 2 envs + 1


def test_replicas_tied_through_a_shared_device_are_one_component():
    """8 envs on 8 devices, 2 policies placed by hand on the first two: policy 1 sits with env 1, which policy 0
    serves, so the two policies' blocks wait on each other's device queue."""
    (only,) = classes_of(spin_workflow(8, 2, cpus=8, mode="shared", devices={"env": "0-7", "policy": "0-1"}))
    assert len(only.components) == 1 and len(only.model.replicas) == 10


def test_the_plan_s_micro_schedule_holds_every_replica_s_loop_tasks_and_round_trips():
    spec = spec_from_dict(spin_workflow(8, 4, cpus=16, mode="hybrid"))
    plan = make_plan(build_graph(spec), Cluster.from_spec(spec.cluster))
    loop = [t for t in plan.tasks if t.phase == "loop"]
    assert {t.replica for t in loop if t.worker == "env"} == set(range(8))
    assert Plan.from_dict(plan.to_dict()).tasks == plan.tasks


def loop_tasks_simulated(raw: dict, monkeypatch, copying: bool) -> int:
    """How many loop tasks planning `raw` adds to the scheduler's task lists."""
    added = 0
    add = TaskList.add

    def counting(self, worker, replica, port, seconds, phase, *args, **kwargs):
        nonlocal added
        added += phase == "loop"
        return add(self, worker, replica, port, seconds, phase, *args, **kwargs)

    spec = spec_from_dict(raw)
    with monkeypatch.context() as patch:
        patch.setattr(TaskList, "add", counting)
        if not copying:
            patch.setattr(simulation_cache, "loop_classes", each_alone)
        make_plan(build_graph(spec), Cluster.from_spec(spec.cluster))
    return added


def test_four_like_groups_have_a_quarter_of_the_loop_tasks_simulated(monkeypatch):
    raw = spin_workflow(8, 4, cpus=16, mode="hybrid")
    copying, every_replica = (loop_tasks_simulated(raw, monkeypatch, copying) for copying in (True, False))
    assert copying > 0 and 4 * copying == every_replica
