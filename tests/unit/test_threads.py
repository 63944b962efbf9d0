"""`resources.threads`: a worker outside the loop of a synchronous flow computes on several cores of its node —
checked against the flow and the cluster, explained by the plan, its costs cached apart."""

from __future__ import annotations

import pytest

from m2flow.cluster import Cluster, DeviceId
from m2flow.config import spec_from_dict
from m2flow.errors import PlanError, SpecError
from m2flow.graph import build_graph
from m2flow.planners import make_plan
from m2flow.planners.cache import worker_key, workflow_key
from m2flow.planners.threads import replica_cores, threads_of
from m2flow.runtime.launch import Launch
from m2flow.schedule import ReplicaId
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


def plan_with_learners(threads, replicas: int = 2, cpus: int = 4, nodes: int = 1, pin_cpus: bool = True):
    raw = with_threads("learner", threads, cpus=cpus, mode="shared", env_replicas=replicas)
    raw["workers"]["learner"]["replicas"] = replicas
    raw["cluster"]["nodes"] = nodes
    raw["placement"]["pin_cpus"] = pin_cpus
    spec = spec_from_dict(raw)
    graph = build_graph(spec)
    return graph, make_plan(graph, Cluster.from_spec(spec.cluster))


def cores_by_replica(graph, plan, worker: str = "learner") -> list[list[str]]:
    replicas = range(len(plan.placements[worker].replica_devices))
    return [[core.name for core in replica_cores(graph, plan, ReplicaId(worker, r))] for r in replicas]


def test_a_workers_replicas_on_a_node_take_disjoint_blocks_of_its_cores():
    assert cores_by_replica(*plan_with_learners(2)) == [["n0/cpu0", "n0/cpu1"], ["n0/cpu2", "n0/cpu3"]]


def test_a_count_above_a_replicas_share_of_its_node_is_lowered_to_it_and_the_plan_says_so():
    graph, plan = plan_with_learners(3)
    assert cores_by_replica(graph, plan) == [["n0/cpu0", "n0/cpu1"], ["n0/cpu2", "n0/cpu3"]]
    assert "3 lowered to its node's cores shared among its replicas there" in " ".join(plan.notes)


def test_the_plan_names_the_cores_each_replica_of_a_worker_on_several_computes_on():
    spec = spec_from_dict(with_threads("learner", 2, cpus=2, mode="shared"))
    plan = make_plan(build_graph(spec), Cluster.from_spec(spec.cluster))
    notes = [note for note in plan.notes if note.startswith("threads:")]
    assert notes == [
        "threads: learner computes on a block of its node's cores outside the loop, idle then (resources.threads: 2):"
        " [0] n0/cpu0 + n0/cpu1; busy time is charged to each replica's planned slot"
    ]


def test_auto_shares_a_nodes_cores_among_the_workers_replicas_there_not_the_clusters():
    graph, plan = plan_with_learners("auto", replicas=2, cpus=8, nodes=2)  # both learners on node 0's 4 cores
    assert [device.node for device in plan.placements["learner"].replica_devices] == [0, 0]
    assert cores_by_replica(graph, plan) == [["n0/cpu0", "n0/cpu1"], ["n0/cpu2", "n0/cpu3"]]
    assert next(n for n in plan.notes if n.startswith("threads:")) == (
        "threads: learner computes on a block of its node's cores outside the loop, idle then (resources.threads:"
        " auto): [0] n0/cpu0 + n0/cpu1; [1] n0/cpu2 + n0/cpu3; busy time is charged to each replica's planned slot"
    )


def test_auto_on_a_loop_worker_gives_it_one_core_and_says_why():
    spec = spec_from_dict(with_threads("env", "auto", cpus=2, mode="shared"))
    graph = build_graph(spec)
    plan = make_plan(graph, Cluster.from_spec(spec.cluster))
    assert threads_of(graph, plan, "env", plan.placements["env"].replica_devices[0]) == 1
    assert "threads: env computes on one core a replica (resources.threads: auto): env runs in the loop" in (
        " ".join(plan.notes)
    )


@pytest.mark.parametrize("threads", [0, True, 1025, 1.5, "two"])
def test_a_count_of_threads_that_is_not_a_positive_count_or_auto_is_refused_naming_the_key(threads):
    with pytest.raises(SpecError) as caught:
        spec_from_dict(with_threads("learner", threads))
    assert "workers.learner.resources.threads" in str(caught.value)


def test_auto_where_the_replicas_fill_their_node_says_one_core_each_and_why():
    graph, plan = plan_with_learners("auto", replicas=2, cpus=2)
    assert cores_by_replica(graph, plan) == [["n0/cpu0"], ["n0/cpu1"]]
    assert (
        "threads: learner computes on one core a replica (resources.threads: auto): node n0's 2 core(s) shared among"
        " its 2 replica(s) there"
    ) in plan.notes


def test_two_workers_on_several_cores_each_are_told_they_share_cores_where_their_calls_run_at_once():
    raw = with_threads("learner", 2, cpus=2, mode="shared")
    raw["workers"]["critic"] = {**raw["workers"]["learner"]}
    raw["flow"]["then"].append("env.trajectory -> critic.train")
    spec = spec_from_dict(raw)
    plan = make_plan(build_graph(spec), Cluster.from_spec(spec.cluster))
    assert any(note.startswith("threads: learner, critic compute on several cores each") for note in plan.notes)


def test_costs_measured_on_several_cores_are_cached_apart_from_one_cores_and_on_a_gpu_alike():
    one, two = (build_graph(spec_from_dict(with_threads("learner", n))) for n in (1, 2))
    assert worker_key(two, "learner", "cpu") != worker_key(one, "learner", "cpu")
    assert worker_key(two, "learner", "gpu") == worker_key(one, "learner", "gpu")
    assert worker_key(one, "learner", "cpu") == worker_key(build_graph(spec_from_dict(workflow())), "learner", "cpu")


def test_auto_is_cached_apart_by_the_cores_of_a_node_and_the_replicas_that_share_them():
    def key(cpus: int, replicas: int) -> str:
        raw = with_threads("learner", "auto", cpus=cpus, env_replicas=replicas)
        raw["workers"]["learner"]["replicas"] = replicas
        return worker_key(build_graph(spec_from_dict(raw)), "learner", "cpu")

    assert len({key(2, 1), key(4, 1), key(2, 2)}) == 3


def test_a_refused_count_is_cached_as_one_cores_its_replicas_compute_on():
    raw = with_threads("env", "auto")  # a loop worker: auto is one core
    assert worker_key(build_graph(spec_from_dict(raw)), "env", "cpu") == worker_key(
        build_graph(spec_from_dict(workflow())), "env", "cpu"
    )


def test_threads_are_no_part_of_the_key_of_a_runs_own_overheads():
    assert workflow_key(build_graph(spec_from_dict(with_threads("learner", 2)))) == workflow_key(
        build_graph(spec_from_dict(workflow()))
    )


def test_a_training_worker_on_one_core_beside_idle_ones_is_told_the_key_that_would_use_them():
    spec = spec_from_dict(workflow(cpus=2, mode="shared"))
    notes = [note for note in make_plan(build_graph(spec), Cluster.from_spec(spec.cluster)).notes if "threads" in note]
    assert notes == [
        "threads: learner computes on one core a replica while 1 more core(s) of node n0 idle outside the loop;"
        " workers.learner.resources.threads: auto would compute on 2 (torch intra-op threads: faster for a large model"
        " or batch, slower for a small one; its costs are measured again)"
    ]


def launch_of(graph, plan) -> Launch:
    """A launch of `plan` as far as choosing each replica's cores goes (nothing started)."""
    launch = Launch.__new__(Launch)
    launch.graph, launch.plan = graph, plan
    return launch


def test_a_replica_is_pinned_to_its_block_or_to_a_core_it_borrowed_alone():
    graph, plan = plan_with_learners(2)
    launch, second = launch_of(graph, plan), ReplicaId("learner", 1)
    assert launch._pinned(second, plan.device_of(second)) == [2, 3]
    assert launch._pinned(second, DeviceId(0, "cpu", 3)) == [3]  # a core borrowed after its node was lost


def test_without_pinning_a_replica_still_computes_on_its_blocks_count_of_threads():
    graph, plan = plan_with_learners(2, pin_cpus=False)
    launch, second = launch_of(graph, plan), ReplicaId("learner", 1)
    assert launch._pinned(second, plan.device_of(second)) is None
    assert len(launch._computes_on(second, plan.device_of(second))) == 2
