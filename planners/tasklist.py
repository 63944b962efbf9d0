"""The event simulator's task list: tasks with durations (their work) and dependencies, scheduled on devices.

`simulate.py` adds the tasks of a candidate's program and schedules each phase's; here a task is ready once
its dependencies have ended. A GPU (or a core with one process) runs its ready tasks one after another, first
come first served; a CPU core that hosts several processes shares its time among their tasks in progress
(`planners/timeshare.py`). Two loop-specific turns: a call of a port that merges slices takes in the next
slices whose inputs have ended by the time its process is free to call (`merge_slices`), and the loop's
components that copy a simulated one get its tasks (`planners/symmetry.py`).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

from m2flow.cluster import DeviceId
from m2flow.planners.processes import process_of
from m2flow.planners.symmetry import LoopClass
from m2flow.planners.timeshare import TimeSharedCore, time_shared_cores
from m2flow.schedule import ReplicaId, Task


@dataclass
class Mergeable:
    """A call of a port that merges slices (`merge_slices`): its rows, its cost for given rows, and the next
    slice's call of the same replica, port and step, which it may take in."""

    rows: float
    cost: Callable[[float], float]
    follower: int | None = None


@dataclass(slots=True)
class Waiting:
    """Tasks with one list of dependencies (a broadcast's receivers share it): how many of those are still to
    end, when the last ended so far did, and the tasks that start once all have."""

    pending: int
    ready: float
    tasks: list[int]


class TaskList:
    """Tasks with durations and dependencies, scheduled on their devices. Tasks with the same
    dependencies share one list, which `run` follows once for all of them: a broadcast's inputs are fanned out
    to its n receivers once, not n times."""

    def __init__(self, devices: dict[str, list[DeviceId]], together: dict[ReplicaId, int]):
        self.tasks: list[Task] = []
        self.duration: list[float] = []
        self.receiving: list[float] = []  # the part of each task's duration spent receiving its inputs
        self.devices = devices
        self.together = together  # co-hosted replicas -> their process (the others run alone)
        self.time_shared = time_shared_cores(devices, together)  # CPU cores the kernel shares among processes
        self.mergeable: dict[int, Mergeable] = {}  # by task id: the calls of a port that merges slices
        self.taken_in: set[int] = set()  # calls done inside an earlier slice's call
        self.dep_lists: dict[tuple[int, ...], list[int]] = {}  # one list object per distinct dependencies

    def add(
        self,
        worker: str,
        replica: int,
        port: str,
        seconds: float,
        phase: str,
        deps: list[int],
        step: int = -1,
        stage: int = 0,
        receiving: float = 0.0,
    ) -> int:
        device = self.devices[worker][replica]
        key = tuple(sorted(set(deps)))
        shared = self.dep_lists.get(key)
        if shared is None:
            shared = self.dep_lists[key] = list(key)
        task = Task(len(self.tasks), worker, replica, port, device, 0.0, 0.0, phase, step, stage, shared)
        self.tasks.append(task)
        self.duration.append(seconds + receiving)
        self.receiving.append(receiving)
        return task.id

    def may_merge(self, tid: int, rows: float, cost: Callable[[float], float], after: int | None) -> None:
        """Task `tid`, a call of `rows` rows costing `cost(rows)`, may take in the slices after it; `after` is the
        previous slice's call of the same replica, port and step (None for the first slice)."""
        self.mergeable[tid] = Mergeable(rows, cost)
        if after is not None:
            self.mergeable[after].follower = tid

    def _take_in(self, tid: int, start: float, ends: dict[int, float], first: int) -> None:
        """Merge into `tid`, starting at `start`, the following slices' calls whose other inputs ended by then."""
        chain, follower = [tid], self.mergeable[tid].follower
        while follower is not None and all(
            d < first or ends.get(d, math.inf) <= start for d in self.tasks[follower].deps if d != chain[-1]
        ):
            chain.append(follower)
            follower = self.mergeable[follower].follower
        if len(chain) == 1:
            return
        receiving = sum(self.receiving[t] for t in chain)
        self.duration[tid] = self.mergeable[tid].cost(sum(self.mergeable[t].rows for t in chain)) + receiving
        self.receiving[tid] = receiving
        for t in chain[1:]:
            self.duration[t] = self.receiving[t] = 0.0
            self.taken_in.add(t)

    def run(self, start: float, first: int) -> float:
        """Schedule tasks[first:] (dependencies inside that range), starting no earlier than `start`."""
        waiting: dict[int, Waiting] = {}  # by id() of a dependency list
        children: dict[int, list[Waiting]] = {}
        for task in self.tasks[first:]:
            group = waiting.get(id(task.deps))
            if group is None:
                inside = [d for d in task.deps if d >= first]
                group = waiting[id(task.deps)] = Waiting(len(inside), start, [])
                for dep in inside:
                    children.setdefault(dep, []).append(group)
            group.tasks.append(task.id)
        heap = [(start, tid) for group in waiting.values() if group.pending == 0 for tid in group.tasks]
        heapq.heapify(heap)
        device_free: dict[DeviceId, float] = {}
        ends: dict[int, float] = {}
        end = start
        cores = {device: TimeSharedCore() for device in self.time_shared}
        core_ends: list[tuple[float, int, DeviceId]] = []  # (when, token, core): the next end on each core
        tokens = itertools.count()
        admitted: set[int] = set()  # tasks that follow their process's ended one on a shared core

        def release(tid: int, at: float) -> None:
            """Task `tid`'s output is out at `at`: its dependants whose inputs are all out become ready."""
            nonlocal end
            ends[tid] = at
            end = max(end, at)
            for group in children.get(tid, ()):
                group.ready = max(group.ready, at)
                group.pending -= 1
                if group.pending == 0:
                    for child in group.tasks:
                        heapq.heappush(heap, (group.ready, child))

        def begin_on_core(tid: int, at: float, core: TimeSharedCore) -> None:
            if tid in self.mergeable:
                self._take_in(tid, at, ends, first)
            task = self.tasks[tid]
            task.start, task.work_s = at, self.duration[tid]
            core.start(tid, task.work_s)

        def next_end_on(device: DeviceId, core: TimeSharedCore) -> None:
            when = core.next_end()
            if when is not None:
                core.token = next(tokens)
                heapq.heappush(core_ends, (when, core.token, device))

        while heap or core_ends:
            if core_ends and (not heap or core_ends[0][0] <= heap[0][0]):  # ends first: their outputs are out
                now, token, device = heapq.heappop(core_ends)
                core = cores[device]
                if token != core.token:
                    continue
                core.advance(now)
                ended, following = core.finish()
                for tid in ended:
                    self.tasks[tid].end = now
                    release(tid, now)
                for tid in following:  # they begin once every end at this instant is out, as a ready task would
                    admitted.add(tid)
                    heapq.heappush(heap, (now, tid))
                next_end_on(device, core)
                continue
            ready, tid = heapq.heappop(heap)
            task = self.tasks[tid]
            if tid in self.taken_in:  # done by the call that took it in: its output is out when that one's is
                task.start = task.end = ready
                release(tid, ready)
                continue
            core = cores.get(task.device)
            if core is not None:
                core.advance(ready)
                process = process_of(self.together, ReplicaId(task.worker, task.replica))
                if tid in admitted or core.arrive(tid, process):
                    begin_on_core(tid, ready, core)
                    next_end_on(task.device, core)
                continue
            if tid in self.mergeable:  # its process takes in what has arrived when it is free to call
                self._take_in(tid, ready, ends, first)
            task.start, task.work_s = max(ready, device_free.get(task.device, start)), self.duration[tid]
            task.end = task.start + task.work_s
            device_free[task.device] = task.end
            release(tid, task.end)
        return end

    def copy_classes(self, loop: range, classes: list[LoopClass]) -> None:
        """Give each class's other components the schedule of its model, whose tasks are those in `loop`."""
        model_tasks: dict[ReplicaId, list[int]] = {}
        for task in self.tasks[loop.start : loop.stop]:
            model_tasks.setdefault(ReplicaId(task.worker, task.replica), []).append(task.id)
        for loop_class in classes:
            model = loop_class.model
            tids = sorted(t for me in model.replicas for t in model_tasks.get(me, ()))
            for copy in loop_class.copies:
                replica = dict(zip(model.replicas, copy.replicas, strict=True))
                device = dict(zip(model.devices, copy.devices, strict=True))
                new_id: dict[int, int] = {}
                for t in tids:
                    task = self.tasks[t]
                    new_id[t] = tid = len(self.tasks)
                    me = replica[ReplicaId(task.worker, task.replica)]
                    self.tasks.append(
                        Task(
                            tid,
                            task.worker,
                            me.replica,
                            task.port,
                            device[task.device],
                            task.start,
                            task.end,
                            task.phase,
                            task.step,
                            task.stage,
                            [new_id[d] for d in task.deps],
                            task.work_s,
                        )
                    )
                    self.duration.append(self.duration[t])
                    self.receiving.append(self.receiving[t])
