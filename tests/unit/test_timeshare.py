"""How the event simulator runs several processes' tasks on one device: a CPU core the kernel time-shares
(`planners/timeshare.py`), a GPU in turn; and in what order a process calls, and what a merging call takes in."""

from __future__ import annotations

import pytest

from m2flow.cluster import Cluster, DeviceId
from m2flow.config import spec_from_dict
from m2flow.graph import build_graph
from m2flow.planners import make_plan
from m2flow.planners.tasklist import TaskList
from m2flow.schedule import Plan, ReplicaId
from m2flow.viz.gantt import write_gantt_html
from tests.unit.test_symmetry import spin_workflow

CPU0, GPU0 = DeviceId(0, "cpu", 0), DeviceId(0, "gpu", 0)


def two_workers_on(device: DeviceId, together: dict[ReplicaId, int] | None = None) -> TaskList:
    return TaskList({"a": [device], "b": [device]}, together or {})


def spans(tasks: TaskList) -> list[tuple[float, float]]:
    return [(round(t.start, 9), round(t.end, 9)) for t in tasks.tasks]


def test_two_processes_with_work_on_one_core_each_run_at_half_speed():
    tasks = two_workers_on(CPU0)
    tasks.add("a", 0, "slow", 3.0, "then", [])
    tasks.add("b", 0, "fast", 1.0, "then", [])
    assert tasks.run(0.0, 0) == 4.0
    assert spans(tasks) == [(0.0, 4.0), (0.0, 2.0)]  # both run from 0; the fast one ends at 2, the slow one at 4
    assert [t.work_s for t in tasks.tasks] == [3.0, 1.0]


def test_a_gpu_runs_its_processes_tasks_one_after_another():
    tasks = two_workers_on(GPU0)
    tasks.add("a", 0, "slow", 3.0, "then", [])
    tasks.add("b", 0, "fast", 1.0, "then", [])
    assert tasks.run(0.0, 0) == 4.0
    assert spans(tasks) == [(0.0, 3.0), (3.0, 4.0)]


def test_co_hosted_replicas_share_no_core_time_they_run_one_call_at_a_time():
    tasks = two_workers_on(CPU0, {ReplicaId("a", 0): 0, ReplicaId("b", 0): 0})
    tasks.add("a", 0, "slow", 3.0, "then", [])
    tasks.add("b", 0, "fast", 1.0, "then", [])
    tasks.run(0.0, 0)
    assert spans(tasks) == [(0.0, 3.0), (3.0, 4.0)]


def test_a_process_runs_its_own_tasks_in_turn_while_sharing_the_core_with_another():
    tasks = two_workers_on(CPU0)
    tasks.add("a", 0, "first", 1.0, "then", [])
    tasks.add("a", 0, "second", 1.0, "then", [])
    tasks.add("b", 0, "long", 2.0, "then", [])
    tasks.run(0.0, 0)
    # a's first call and b share the core until 2; a's second call starts then and shares it with b's last second
    assert spans(tasks) == [(0.0, 2.0), (2.0, 4.0), (0.0, 4.0)]


def test_a_task_that_becomes_ready_joins_the_task_in_progress():
    tasks = two_workers_on(CPU0)
    first = tasks.add("a", 0, "first", 1.0, "then", [])
    tasks.add("a", 0, "after", 2.0, "then", [first])
    tasks.add("b", 0, "long", 2.5, "then", [])
    tasks.run(0.0, 0)
    # a.first and b share the core until a.first ends at 2 (b has 1.5 left); a.after joins b then, b ends at 5
    assert spans(tasks) == [(0.0, 2.0), (2.0, 5.5), (0.0, 5.0)]


def test_a_call_waiting_for_its_gpu_takes_in_the_slices_arrived_when_its_process_was_free():
    """The process picks its slices when it gathers the first (`runtime/loop.py`), not when the GPU it queues
    on frees up: the second slice, out while the call waits for another process's work, is called alone."""
    tasks = TaskList({"env": [CPU0], "policy": [GPU0], "render": [GPU0]}, {})
    slice0 = tasks.add("env", 0, "step", 1.0, "loop", [])
    slice1 = tasks.add("env", 0, "step", 1.0, "loop", [slice0])
    tasks.add("render", 0, "draw", 3.0, "loop", [])
    act0 = tasks.add("policy", 0, "act", 1.0, "loop", [slice0])
    act1 = tasks.add("policy", 0, "act", 1.0, "loop", [slice1, act0])
    tasks.may_merge(act0, 1, lambda rows: 1.0, None)
    tasks.may_merge(act1, 1, lambda rows: 1.0, act0)
    tasks.run(0.0, 0)
    assert (tasks.tasks[act0].start, tasks.tasks[act1].work_s) == (3.0, 1.0)


def test_a_call_of_no_work_on_a_shared_core_ends_where_it_starts():
    tasks = two_workers_on(CPU0)
    tasks.add("a", 0, "long", 2.0, "then", [])
    first = tasks.add("b", 0, "nothing", 0.0, "then", [])
    tasks.add("b", 0, "after", 1.0, "then", [first])
    tasks.run(0.0, 0)
    assert spans(tasks) == [(0.0, 3.0), (0.0, 0.0), (0.0, 2.0)]


@pytest.mark.parametrize("queued", [False, True])
def test_a_merging_call_takes_in_a_slice_out_at_its_start_whether_it_waited_for_its_process_or_its_input(queued):
    """The second slice's input ends at 2, when the policy's previous call does: the call that starts then takes
    it in, whether it was queued behind that call or became ready with it."""
    cpu1 = DeviceId(0, "cpu", 1)
    tasks = TaskList({"env": [CPU0], "other": [CPU0], "policy": [cpu1], "neighbour": [cpu1]}, {})
    step = tasks.add("env", 0, "step", 1.5, "loop", [])
    tasks.add("other", 0, "work", 0.5, "loop", [])  # shares core 0 with the step until 1: the step ends at 2
    previous = tasks.add("policy", 0, "previous", 1.0, "loop", [])
    tasks.add("neighbour", 0, "work", 1.0, "loop", [])  # shares core 1: the previous call ends at 2
    act0 = tasks.add("policy", 0, "act", 1.0, "loop", [] if queued else [previous])
    act1 = tasks.add("policy", 0, "act", 1.0, "loop", [step, act0])
    tasks.may_merge(act0, 1, lambda rows: 1.0, None)
    tasks.may_merge(act1, 1, lambda rows: 1.0, act0)
    tasks.run(0.0, 0)
    assert (tasks.tasks[act0].start, tasks.tasks[act1].work_s) == (2.0, 0.0)


def spin_plan(colocate, stages: int) -> Plan:
    """One simulator process of 4 envs and a policy whose call costs mostly per call, on one core."""
    raw = spin_workflow(1, 1, 1, "shared", stages, colocate=colocate, trainers=1)
    raw["workers"]["env"]["profile"]["step"] = {"fixed_s": 1e-3, "per_item_s": 0.0}
    raw["workers"]["policy"]["profile"]["act"] = {"fixed_s": 3e-3, "per_item_s": 1e-4}
    raw["flow"]["loop"]["horizon"] = 8
    graph = build_graph(spec_from_dict(raw))
    return make_plan(graph, Cluster.from_spec(graph.spec.cluster))


def calls_in_step(plan: Plan, step: int, port: str) -> list:
    return [t for t in plan.tasks if t.phase == "loop" and t.step == step and t.port == port]


def test_co_hosted_simulator_and_policy_act_once_a_step_on_every_slice_as_a_run_traced():
    """The process calls in the global (step, port, slice) order: the policy's call of slice 0 comes after the
    simulator's calls of every slice, whose outputs it takes in. A run of this layout (the spin-per-call
    workload of `benchmarks/planner_accuracy.py`) traced one call of 8 rows a step after 4 env steps."""
    plan = spin_plan(True, 4)
    assert plan.processes == [[ReplicaId("env", 0), ReplicaId("policy", 0)]]
    acts, steps = calls_in_step(plan, 5, "act"), calls_in_step(plan, 5, "step")
    assert [t.work_s > 0 for t in acts] == [True, False, False, False]
    assert acts[0].start >= max(t.end for t in calls_in_step(plan, 4, "step"))
    assert min(t.start for t in steps) >= acts[0].end


@pytest.mark.parametrize("stages, calls", [(2, 2), (4, 2)])
def test_a_policy_in_its_own_process_takes_in_only_the_slices_arrived_when_it_is_free_to_call(stages, calls):
    """On a core shared with the simulator the policy starts a call as soon as a slice arrives, while the
    simulator steps the next slices beside it: 2 slices give 2 calls a step, 4 slices 2 calls (the first on
    one slice, the second on the 3 that arrived during it); runs of the spin-per-call workload in separate
    processes measured about 2 calls a step at both."""
    plan = spin_plan(False, stages)
    assert plan.processes == []
    assert sum(t.work_s > 0 for t in calls_in_step(plan, 5, "act")) == calls


def test_the_chart_says_where_a_call_shares_its_core(tmp_path):
    page = write_gantt_html(spin_plan(False, 2), tmp_path / "gantt.html").read_text()
    assert "of work: the core is shared" in page
    assert "of work: the core is shared" not in write_gantt_html(spin_plan(True, 2), tmp_path / "one.html").read_text()
