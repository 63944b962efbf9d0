"""GPU memory shares from the plan: each process on a shared GPU may hold the usable memory less what the
others resident beside it are estimated to need (no Ray, no torch)."""

from __future__ import annotations

import pytest

from m2flow.context import WorkerContext
from m2flow.runtime.gpu_memory import out_of_share
from m2flow.schedule import Plan, ReplicaId
from tests.unit.test_planner import plan_of, workflow


def on_one_gpu(policy_gb: float, learner_gb: float, **placement) -> dict:
    raw = workflow(mode="shared")
    raw["cluster"] = {"gpus": 1, "cpus": 1, "gpu_memory_gb": 80}
    raw["workers"]["policy"]["resources"] = {"memory_gb": policy_gb}
    raw["workers"]["learner"]["resources"] = {"memory_gb": learner_gb}
    raw["placement"].update(placement)
    return raw


def test_processes_on_one_gpu_each_get_what_the_others_estimates_leave():
    plan = plan_of(on_one_gpu(10, 30))
    policy, learner = ReplicaId("policy", 0), ReplicaId("learner", 0)
    assert plan.device_of(policy) == plan.device_of(learner)
    assert plan.memory_shares == {policy: pytest.approx(0.9 - 30 / 80), learner: pytest.approx(0.9 - 10 / 80)}
    assert any(note.startswith("memory shares on n0/gpu0 (80 GB): ") for note in plan.notes)
    assert Plan.from_dict(plan.to_dict()).memory_shares == plan.memory_shares
    assert plan.memory_gb(policy) == pytest.approx(0.9 * 80 - 30)  # what its process is capped at, in GB


def test_workers_that_swap_out_between_phases_each_get_the_gpu_while_the_other_is_out():
    plan = plan_of(on_one_gpu(30, 70))  # 100 GB on 80: they take turns
    assert any(p.offload or p.onload for p in plan.phases)
    assert plan.memory_shares == {ReplicaId("policy", 0): 0.9, ReplicaId("learner", 0): 0.9}


def test_a_process_alone_on_its_gpu_is_not_capped():
    raw = on_one_gpu(10, 30, mode="disaggregated")
    raw["cluster"]["gpus"] = 2
    plan = plan_of(raw)
    assert plan.device_of(ReplicaId("policy", 0)) != plan.device_of(ReplicaId("learner", 0))
    assert plan.memory_shares == {}


def test_a_gpu_where_a_worker_has_no_estimate_gets_no_shares_and_a_note_naming_it():
    plan = plan_of(on_one_gpu(10, 0))
    assert plan.memory_shares == {}
    assert any("no memory shares on n0/gpu0: workers.learner has no memory estimate" in n for n in plan.notes)


def test_memory_shares_can_be_turned_off():
    plan = plan_of(on_one_gpu(10, 30, memory_shares=False))
    assert plan.memory_shares == {}
    assert not any("memory shares" in note for note in plan.notes)


class OutOfMemoryError(RuntimeError):
    """Named as torch's, which the host recognises by name (it imports no torch)."""


def test_running_out_of_the_share_names_the_share_and_the_key_to_declare():
    ctx = WorkerContext(worker="rollout", gpu_memory_gb=42.0)
    hint = out_of_share(ctx, OutOfMemoryError("CUDA out of memory"))
    assert "workers.rollout ran out of its share of the GPU's memory (42 GB" in hint
    assert "workers.rollout.resources.memory_gb" in hint
    assert out_of_share(ctx, ValueError("bad")) == ""
    assert out_of_share(WorkerContext(worker="rollout"), OutOfMemoryError("CUDA out of memory")) == ""
