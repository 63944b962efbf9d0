"""Sync edges' transports: chosen from the plan's devices, and a packed state rebuilt bit for bit."""

from __future__ import annotations

import pytest
import torch

from m2flow.cluster import DeviceId
from m2flow.errors import PlanError
from m2flow.runtime.weight_sync import (
    ALIGN,
    CollectiveTransport,
    KeptBuckets,
    ObjectStoreTransport,
    Route,
    StateManifest,
    pack,
    unpack,
)
from m2flow.transfer import choose_transport, mapping_kept
from tests.unit.test_memory_shares import on_one_gpu
from tests.unit.test_planner import plan_of

GPU0, GPU1, GPU2 = (DeviceId(0, "gpu", i) for i in range(3))
CPU0, CPU1 = DeviceId(0, "cpu", 0), DeviceId(0, "cpu", 1)


@pytest.mark.parametrize(
    ("source", "targets", "expected"),
    [
        (GPU0, [GPU0, GPU0], "cuda_ipc"),  # training and inference share the GPU: map its memory
        (GPU0, [GPU1, GPU2], "collective"),  # one GPU each: NCCL
        (CPU0, [CPU1], "collective"),  # CPU slots: gloo
        (GPU0, [GPU0, GPU1], "object_store"),  # neither a shared GPU nor one rank per GPU
        (GPU0, [CPU0], "object_store"),  # a CPU destination of a GPU source
    ],
)
def test_auto_prefers_ipc_then_a_group_then_the_object_store_as_the_devices_allow(source, targets, expected):
    assert choose_transport("auto", source, targets, same_process=False, where="flow.sync[0]") == expected


def test_replicas_in_the_source_process_sync_through_the_object_store():
    assert choose_transport("auto", GPU0, [GPU0], same_process=True, where="flow.sync[0]") == "object_store"


@pytest.mark.parametrize(
    ("requested", "source", "targets", "reason"),
    [
        ("cuda_ipc", GPU0, [GPU1], "needs every destination replica on the source's GPU n0/gpu0"),
        ("collective", GPU0, [GPU0], "one GPU per member of the group"),
        ("collective", GPU0, [CPU0], "one device kind"),
    ],
)
def test_a_transport_the_devices_do_not_allow_is_refused_with_the_key_and_the_fix(requested, source, targets, reason):
    with pytest.raises(PlanError, match=rf"flow.sync\[1\].transport: {requested} .*{reason}.*transport: auto"):
        choose_transport(requested, source, targets, same_process=False, where="flow.sync[1]")


def _state() -> dict:
    torch.manual_seed(0)
    return {
        "version": 7,
        "checksum": 1.5,
        "scope": "all",
        "state": {
            "w": torch.randn(3, 5),
            "b": torch.randn(5, dtype=torch.bfloat16),
            "steps": torch.tensor(9, dtype=torch.int64),
            "mask": torch.ones(7, dtype=torch.bool),
            "strided": torch.randn(6, 4).t(),  # not contiguous
        },
    }


@pytest.mark.parametrize("bucket_bytes", [1 << 20, 64])  # one bucket; a bucket per tensor
def test_a_packed_state_unpacks_bit_for_bit_with_its_plain_fields(bucket_bytes):
    value = _state()
    fields, slots, buckets = pack(value, "cpu", bucket_bytes)
    assert fields == {"version": 7, "checksum": 1.5, "scope": "all"}
    assert all(s.offset % ALIGN == 0 for s in slots)
    assert len(buckets) == (1 if bucket_bytes > 1000 else len(value["state"]))
    rebuilt = unpack(StateManifest(fields, slots, tuple(b.numel() for b in buckets)), buckets)
    assert rebuilt.keys() == value.keys() and rebuilt["state"].keys() == value["state"].keys()
    for name, tensor in value["state"].items():
        got = rebuilt["state"][name]
        assert got.dtype == tensor.dtype and got.shape == tensor.shape
        assert torch.equal(got, tensor), name


def test_kept_buckets_are_refilled_while_the_layout_holds_and_made_anew_when_it_changes():
    kept = KeptBuckets("cpu")
    value = _state()
    assert kept.pack(value)[2]  # new
    first = [b.data_ptr() for b in kept.buckets]
    value["state"]["w"].add_(1.0)
    fields, slots, fresh = kept.pack(value)  # the next sync: the same names, dtypes and shapes
    assert not fresh and [b.data_ptr() for b in kept.buckets] == first
    assert torch.equal(unpack(StateManifest(fields, slots, ()), kept.buckets)["state"]["w"], value["state"]["w"])
    value["state"]["w"] = torch.randn(4, 5)  # a new shape: a new layout
    fields, slots, fresh = kept.pack(value)
    assert fresh and [b.data_ptr() for b in kept.buckets] != first
    assert torch.equal(unpack(StateManifest(fields, slots, ()), kept.buckets)["state"]["w"], value["state"]["w"])
    kept.clear()  # offloaded
    assert kept.buckets == [] and kept.pack(value)[2]


def test_a_sync_destination_keeps_the_source_s_buckets_mapped_only_where_the_source_stays_on_its_device():
    resident, swapping = plan_of(on_one_gpu(10, 30)), plan_of(on_one_gpu(30, 70))
    assert not any(p.offload for p in resident.phases)
    assert {w for p in swapping.phases for w in p.offload} == {"learner", "policy"}
    assert mapping_kept(resident, "learner")
    assert not mapping_kept(swapping, "learner")


def test_the_object_store_carries_host_copies_that_training_cannot_change():
    value = _state()
    sent = ObjectStoreTransport(Route("object_store"), "cpu").publish(value)
    value["state"]["w"].add_(1.0)
    assert sent["version"] == 7
    assert not torch.equal(sent["state"]["w"], value["state"]["w"])


def test_a_sync_port_returning_no_tensors_goes_through_unchanged():
    for value in ({"version": 3}, [1, 2], 7):
        assert ObjectStoreTransport(Route("object_store"), "cpu").publish(value) == value
        assert CollectiveTransport(Route("collective"), "cpu").publish(value) == value


def _sync_workflow(edges: list[str], cpus: int = 2) -> dict:
    spin = {"kind": "inference", "class": "m2flow.workers.synthetic.SpinPolicy"}
    return {
        "name": "syncs",
        "workers": {
            "trainer": {"kind": "training", "class": "m2flow.workers.synthetic.SpinTrainer"},
            "policy": spin,
            "shadow": spin,
        },
        "flow": {"sync": [{"edge": edge} for edge in edges]},
        "placement": {"mode": "shared"},
        "cluster": {"cpus": cpus, "gpus": 0},
    }


def test_the_plan_names_a_transport_for_every_sync_edge_even_two_from_one_port():
    plan = _plan(_sync_workflow(["trainer.weights -> policy.load_weights", "trainer.weights -> shadow.load_weights"]))
    assert plan.transports == {
        "trainer.weights -> policy.load_weights": "collective",
        "trainer.weights -> shadow.load_weights": "collective",
    }
    assert "sync: trainer.weights -> shadow.load_weights moves by collective" in plan.notes


def test_a_worker_syncing_itself_uses_the_object_store_since_one_process_cannot_meet_itself():
    raw = _sync_workflow(["policy.act -> policy.load_weights"])
    assert _plan(raw).transports == {"policy.act -> policy.load_weights": "object_store"}


def _plan(raw: dict):
    from m2flow.cluster import Cluster
    from m2flow.config import spec_from_dict
    from m2flow.graph import build_graph
    from m2flow.planners import make_plan

    spec = spec_from_dict(raw)
    return make_plan(build_graph(spec), Cluster.from_spec(spec.cluster))


def test_the_transport_weighs_every_replica_the_planner_gives_a_destination_of_replicas_auto():
    """The inference worker declared `replicas: auto` (one in the graph as written) is planned on both GPUs: the
    weights cannot go by IPC from the actor's GPU to the second, nor by a group of one rank per GPU (the actor
    shares the first)."""
    import copy

    from m2flow.cluster import Cluster
    from m2flow.config import spec_from_dict
    from m2flow.graph import build_graph
    from m2flow.planners import make_plan
    from tests.unit.test_worker_args import MAIN

    raw = copy.deepcopy(MAIN)
    raw["cluster"] = {"cpus": 8, "gpus": 2}
    raw["workers"]["rollout"]["replicas"] = "auto"
    for worker in ("rollout", "actor"):
        raw["workers"][worker]["resources"] = {"device": "gpu"}
    graph = build_graph(spec_from_dict(raw))
    assert graph.info["rollout"].replicas == 1
    plan = make_plan(graph, Cluster.from_spec(graph.spec.cluster))
    assert [str(d) for d in plan.placements["rollout"].replica_devices] == ["n0/gpu0", "n0/gpu1"]
    assert [str(d) for d in plan.placements["actor"].replica_devices] == ["n0/gpu0"]
    assert plan.transports["actor.weights -> rollout.load_weights"] == "object_store"
