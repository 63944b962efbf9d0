"""`resources.threads`: a worker outside the loop of a synchronous flow computes on several cores of its node —
checked against the flow and the cluster, explained by the plan, its costs cached apart."""

from __future__ import annotations

import pytest

from m2flow.cluster import Cluster, DeviceId
from m2flow.config import spec_from_dict
from m2flow.errors import PlanError, SpecError
from m2flow.graph import build_graph
from m2flow.planners import make_plan
from m2flow.planners.cache import worker_key
from tests.unit.test_planner import workflow


def with_threads(worker: str, threads: int, **changes) -> dict:
    raw = workflow(**changes)
    raw["workers"][worker]["resources"] = {"threads": threads}
    return raw


def test_a_loop_worker_on_several_cores_is_refused_naming_its_key():
    with pytest.raises(SpecError) as caught:
        build_graph(spec_from_dict(with_threads("env", 2)))
    assert "workers.env.resources.threads: 2, but env runs in the loop" in str(caught.value)
    assert "use threads: 1" in str(caught.value)


def test_a_training_worker_on_several_cores_under_flow_async_is_refused_naming_its_key():
    raw = with_threads("learner", 2)
    raw["flow"]["async"] = {"max_staleness": 1}
    with pytest.raises(SpecError) as caught:
        build_graph(spec_from_dict(raw))
    assert "workers.learner.resources.threads: 2, but under flow.async learner runs beside the loop" in str(
        caught.value
    )


def test_more_threads_than_a_node_has_cores_is_refused_naming_the_key_and_the_most_it_may_be():
    spec = spec_from_dict(with_threads("learner", 3, cpus=2))
    with pytest.raises(PlanError) as caught:
        make_plan(build_graph(spec), Cluster.from_spec(spec.cluster))
    assert "workers.learner.resources.threads: 3 cores a replica, but a node of the cluster has 2" in str(caught.value)
    assert "to 2 at most" in str(caught.value)


def test_a_replicas_cores_are_its_own_and_the_next_ones_of_its_node_round_from_the_first():
    spec = spec_from_dict({**workflow(cpus=8), "cluster": {"cpus": 8, "gpus": 0, "nodes": 2, "cpu_memory_gb": 4}})
    cluster = Cluster.from_spec(spec.cluster)
    names = [core.name for core in cluster.cores_from(DeviceId(1, "cpu", 6), 3)]
    assert names == ["n1/cpu6", "n1/cpu7", "n1/cpu4"]  # node 1 holds cpu4-cpu7
    assert cluster.fewest_cores() == 4


def test_the_plan_names_the_cores_each_replica_of_a_worker_on_several_computes_on():
    spec = spec_from_dict(with_threads("learner", 2, cpus=2, mode="shared"))
    plan = make_plan(build_graph(spec), Cluster.from_spec(spec.cluster))
    notes = [note for note in plan.notes if note.startswith("threads:")]
    assert notes == [
        "threads: learner computes on 2 cores a replica (resources.threads), idle then outside the loop:"
        " [0] n0/cpu0 + n0/cpu1; its busy time counts on its own core"
    ]


def test_costs_measured_on_several_cores_are_cached_apart_from_one_cores_and_on_a_gpu_alike():
    one, two = (build_graph(spec_from_dict(with_threads("learner", n))) for n in (1, 2))
    assert worker_key(two, "learner", "cpu") != worker_key(one, "learner", "cpu")
    assert worker_key(two, "learner", "gpu") == worker_key(one, "learner", "gpu")
    assert worker_key(one, "learner", "cpu") == worker_key(build_graph(spec_from_dict(workflow())), "learner", "cpu")


def test_a_training_worker_on_one_core_beside_idle_ones_is_told_the_key_that_would_use_them():
    spec = spec_from_dict(workflow(cpus=2, mode="shared"))
    notes = [note for note in make_plan(build_graph(spec), Cluster.from_spec(spec.cluster)).notes if "threads" in note]
    assert notes == [
        "threads: learner computes on one core a replica while 1 more core(s) of node n0 idle outside the loop;"
        " workers.learner.resources.threads: 2 would compute on 2 (torch intra-op threads: faster for a large model"
        " or batch, slower for a small one; its costs are measured again)"
    ]
