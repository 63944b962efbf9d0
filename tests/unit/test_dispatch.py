"""The dispatch vocabulary: who receives which share of a call's inputs, whose outputs stand for the group."""

from __future__ import annotations

import copy
from typing import get_args

import pytest

from m2flow.config import spec_from_dict
from m2flow.dispatch import GATHERS, SPLITS, gather, split
from m2flow.errors import SpecError
from m2flow.graph import build_graph
from m2flow.spec import Dispatch
from tests.unit.test_worker_args import MAIN

SHARD, BROADCAST = Dispatch(split="shard", gather="rank_zero"), Dispatch()


def test_every_split_and_gather_a_config_may_name_has_a_rule_and_every_rule_a_name():
    fields = Dispatch.model_fields
    assert set(get_args(fields["split"].annotation)) == set(SPLITS)
    assert set(get_args(fields["gather"].annotation)) == set(GATHERS)


def test_data_parallel_ranks_receive_disjoint_contiguous_blocks_and_none_the_whole_batch():
    shares = split(SHARD, ["t0", "t1", "t2", "t3"], replicas=2, data_parallel=2)
    assert shares == [["t0", "t1"], ["t2", "t3"]]
    assert all(len(share) < 4 for share in shares)


def test_tensor_parallel_ranks_of_one_group_receive_the_same_block():
    assert split(SHARD, ["a", "b"], replicas=4, data_parallel=2) == [["a"], ["a"], ["b"], ["b"]]
    assert split(SHARD, ["a", "b"], replicas=2, data_parallel=1) == [["a", "b"], ["a", "b"]]


def test_broadcast_gives_every_replica_everything_and_gathers_all():
    assert split(BROADCAST, ["a", "b"], replicas=3, data_parallel=3) == [["a", "b"]] * 3
    assert gather(BROADCAST, [1, 2, 3]) == [1, 2, 3]
    assert gather(SHARD, [1, 2, 3]) == [1]


def test_training_workers_shard_by_default_and_a_port_can_say_otherwise():
    graph = build_graph(spec_from_dict(MAIN))
    assert graph.info["actor"].dispatch("train") == SHARD
    assert graph.info["rollout"].dispatch("load_weights") == BROADCAST
    raw = copy.deepcopy(MAIN)
    raw["workers"]["actor"]["dispatch"] = {"train": {"split": "broadcast"}}
    assert build_graph(spec_from_dict(raw)).info["actor"].dispatch("train").split == "broadcast"


def test_a_rule_on_a_loop_port_is_refused():
    raw = copy.deepcopy(MAIN)
    raw["workers"]["env"]["dispatch"] = {"step": {"split": "shard"}}
    with pytest.raises(SpecError, match="workers.env.dispatch.step: env.step is a loop port"):
        build_graph(spec_from_dict(raw))


def test_declarations_for_the_planner_are_not_ports():
    graph = build_graph(spec_from_dict(MAIN))
    assert not {"Config", "memory_estimate_gb", "data_parallel_size"} & graph.info["actor"].ports
    assert {"train", "weights", "export"} <= graph.info["actor"].ports


def test_a_state_only_the_first_replica_reads_is_planned_and_sent_to_it_alone():
    """The main job's evaluation: `env.evaluate` runs on the first simulator replica only (it holds the
    evaluator), so its sync edge copies the weights to that replica alone; the inference weights go to all."""
    from m2flow.cluster import Cluster
    from m2flow.planners import make_plan

    graph = build_graph(spec_from_dict(MAIN))
    assert graph.info["env"].replicas == 2
    assert graph.info["env"].state_receivers("evaluate") == [0]
    two = copy.deepcopy(MAIN)
    two["workers"]["rollout"]["replicas"] = 2
    assert build_graph(spec_from_dict(two)).info["rollout"].state_receivers("load_weights") == [0, 1]  # broadcast
    assert split(graph.info["env"].dispatch("evaluate"), ["w"], replicas=2, data_parallel=1) == [["w"], []]
    plan = make_plan(graph, Cluster.from_spec(graph.spec.cluster))
    assert {(t.worker, t.replica) for t in plan.tasks if t.port == "evaluate"} == {("env", 0)}


def test_a_then_edge_to_a_port_that_sends_to_the_first_replica_only_is_refused_naming_the_key():
    raw = copy.deepcopy(MAIN)
    raw["workers"]["actor"]["dispatch"] = {"train": {"split": "first"}}
    with pytest.raises(SpecError) as info:
        build_graph(spec_from_dict(raw))
    message = str(info.value)
    assert "flow.then[0] 'env.trajectory -> actor.train': actor.train splits its input 'first'" in message
    assert "give workers.actor.dispatch.train split: broadcast or shard" in message


def test_a_state_sent_to_the_first_replica_alone_costs_it_a_whole_call_whatever_shares_earlier_runs_measured():
    """Runs that called `evaluate` on both replicas measured the first doing all of it (shares 2.0 and 0.0 against
    a line of half the cost); called on the first alone, its calls cost the line: no share doubles it."""
    from m2flow.cluster import Cluster
    from m2flow.planners import make_plan, profile_of
    from m2flow.spec import PortCost

    graph = build_graph(spec_from_dict(MAIN))
    cluster = Cluster.from_spec(graph.spec.cluster)
    profile = profile_of(graph, cluster)
    profile.costs["env.evaluate"] = PortCost(fixed_s=1.5, per_item_s=0.0)
    profile.replica_shares["env.evaluate"] = {2: (2.0, 0.0)}
    plan = make_plan(graph, cluster, profile)
    (evaluation,) = [t for t in plan.tasks if t.port == "evaluate"]
    assert evaluation.end - evaluation.start == pytest.approx(1.5)


def test_a_state_sent_to_the_first_rank_of_a_training_group_alone_is_refused_naming_the_key():
    raw = {
        "name": "group",
        "workers": {
            "env": {"kind": "simulator", "class": "tests.workers_for_tests.Counter", "replicas": 2},
            "policy": {"kind": "inference", "class": "tests.workers_for_tests.PlusOne"},
            "learner": {
                "kind": "training",
                "class": "tests.workers_for_tests.SaveBatch",
                "replicas": 2,
                "dispatch": {"load_state_dict": {"split": "first"}},
            },
        },
        "flow": {
            "loop": {"horizon": 4, "edges": ["env.obs -> policy.act", "policy.act -> env.step"]},
            "then": ["env.trajectory -> learner.train"],
            "sync": [{"edge": "learner.state_dict -> learner.load_state_dict"}],
        },
        "cluster": {"cpus": 4, "gpus": 0},
    }
    with pytest.raises(SpecError) as info:
        build_graph(spec_from_dict(raw))
    message = str(info.value)
    assert "flow.sync[0] 'learner.state_dict -> learner.load_state_dict'" in message
    assert "learner's replicas are ranks of one group" in message
    assert "give workers.learner.dispatch.load_state_dict split: broadcast" in message
