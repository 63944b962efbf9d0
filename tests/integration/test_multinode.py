"""Several Ray nodes on one machine (Ray's own test cluster): the plan's node assignment is what runs,
loop channels cross nodes over TCP, and a node removed mid-run is reported like a dead worker."""

from __future__ import annotations

import threading
import time

import pytest

import m2flow as mf
from m2flow.config import spec_from_dict
from m2flow.errors import WaitTimeout, WorkerError
from m2flow.graph import build_graph
from m2flow.planners import make_plan
from m2flow.runtime.ray_cluster import cluster_from_ray

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def three_nodes():
    import ray
    from ray.cluster_utils import Cluster

    ray.shutdown()
    cluster = Cluster()
    try:
        small = {"object_store_memory": 80 * 2**20}
        nodes = [cluster.add_node(num_cpus=1, **small) for _ in range(3)]
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes()
        yield cluster, nodes
    finally:  # also when the test cluster fails to start: the tests after these get the session's cluster
        ray.shutdown()
        cluster.shutdown()
        ray.init(address="local", num_cpus=2, num_gpus=0, include_dashboard=False, log_to_driver=False)


def workflow(tmp_path, name: str, iterations: int = 2, horizon: int = 5) -> mf.WorkflowSpec:
    return spec_from_dict(
        {
            "name": name,
            "workers": {
                "env": {
                    "kind": "simulator",
                    "class": "tests.workers_for_tests.Counter",
                    "replicas": 2,
                    "args": {"num_envs": 2},
                },
                "policy": {"kind": "inference", "class": "tests.workers_for_tests.PlusOne"},
                "learner": {"kind": "training", "class": "tests.workers_for_tests.Collect"},
            },
            "flow": {
                "loop": {"horizon": horizon, "edges": ["env.obs -> policy.act", "policy.act -> env.step"]},
                "then": ["env.trajectory -> learner.train"],
            },
            "placement": {"mode": "hybrid", "pipeline_stages": 2},
            "run": {
                "iterations": iterations,
                "output_dir": str(tmp_path),
                "progress": False,
                "timeouts": {"floor_s": 20},
            },
        }
    )


def test_replicas_run_on_the_nodes_the_plan_chose(tmp_path, three_nodes):
    result = mf.run(workflow(tmp_path, "nodes"))
    plan = result.plan
    assert plan.cluster.nodes == 3 and len(plan.cluster.node_ids) == 3
    for worker, placement in plan.placements.items():
        for index, device in enumerate(placement.replica_devices):
            planned = plan.cluster.node_ids[device.node]
            assert result.nodes[f"{worker}[{index}]"] == planned
    assert len({result.nodes["env[0]"], result.nodes["policy[0]"]}) == 2, "env and policy should be on two nodes"
    assert result.last["final_sum"] == sum(100 * i + 10 for i in range(4))  # every env stepped 2 x 5 times


def test_a_node_removed_mid_run_is_detected_like_a_dead_worker(tmp_path, three_nodes):
    import ray

    cluster, nodes = three_nodes
    spec = workflow(tmp_path, "losing-a-node", iterations=200, horizon=50)
    plan = make_plan(build_graph(spec), cluster_from_ray(spec.cluster))  # the plan the run will make
    head = nodes[0].node_id  # removing the head would take Ray itself down: remove a node a loop worker is on
    hosting = {plan.cluster.node_ids[d.node] for w in ("env", "policy") for d in plan.placements[w].replica_devices}
    victim = next(n for n in nodes if n.node_id in hosting - {head})
    removed = {}

    def remove_soon():  # once the run iterates: a removal during start-up is a start-up failure, not this case
        metrics = tmp_path / "losing-a-node" / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while not (metrics.exists() and metrics.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.05)
        removed["at"] = time.time()
        cluster.remove_node(victim)

    removal = threading.Thread(target=remove_soon, daemon=True)
    removal.start()
    with pytest.raises((WorkerError, WaitTimeout)) as info:  # a closed channel or a silent peer: both name it
        mf.run(spec)
    detected = time.time() - removed["at"]
    removal.join(timeout=120)  # the run may see the node gone before Ray's harness has finished removing it
    assert not removal.is_alive(), "the node's removal did not finish within 120 s"
    assert detected < 20 + 5, f"detected {detected:.1f}s after the node went away"
    assert "policy" in str(info.value) or "env" in str(info.value)
    assert ray.is_initialized()
