"""Event simulator: a candidate placement -> the predicted micro schedule of one iteration.

It models the same program the executor runs: phases in order (sync, loop, then), inside the loop
every replica calls its ports step by step and slice by slice, a task starts when its inputs exist
and its device is free (devices run one task at a time). Long loops are compressed: the first
steps are simulated and the steady-state step time extrapolates the rest.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from m2flow.graph import MacroGraph
from m2flow.planners.processes import process_groups, same_process
from m2flow.planners.profile import Profile
from m2flow.schedule import Phase, Placement, Task
from m2flow.sharding import shard_groups, slice_sizes
from m2flow.spec import Edge

SIMULATED_STEPS = 16


@dataclass
class Prediction:
    tasks: list[Task]
    iteration_s: float
    phase_s: dict[str, float]
    env_steps: int
    device_busy: dict[str, float]
    bubble_fraction: float
    simulated_steps: int
    port_s: dict[str, float] = field(default_factory=dict)
    loop_step_s: float = 0.0

    def summary(self) -> dict:
        return {
            "iteration_s": self.iteration_s,
            "phase_s": self.phase_s,
            "env_steps_per_iteration": self.env_steps,
            "env_steps_per_s": self.env_steps / self.iteration_s if self.iteration_s > 0 else 0.0,
            "device_busy": self.device_busy,
            "bubble_fraction": self.bubble_fraction,
            "simulated_steps": self.simulated_steps,
            "port_s": self.port_s,
            "loop_step_s": self.loop_step_s,
        }


class _Schedule:
    """Tasks with durations and dependencies, list-scheduled on FIFO devices."""

    def __init__(self, device_names: dict[str, list[str]]):
        self.tasks: list[Task] = []
        self.duration: list[float] = []
        self.device_names = device_names

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
    ) -> int:
        device = self.device_names[worker][replica]
        task = Task(len(self.tasks), worker, replica, port, device, 0.0, 0.0, phase, step, stage, sorted(set(deps)))
        self.tasks.append(task)
        self.duration.append(seconds)
        return task.id

    def run(self, start: float, first: int) -> float:
        """Schedule tasks[first:] (dependencies inside that range), starting no earlier than `start`."""
        pending = {t.id: len([d for d in t.deps if d >= first]) for t in self.tasks[first:]}
        children: dict[int, list[int]] = {}
        ready_at = {t.id: start for t in self.tasks[first:]}
        for task in self.tasks[first:]:
            for dep in task.deps:
                if dep >= first:
                    children.setdefault(dep, []).append(task.id)
        heap = [(start, tid) for tid, n in pending.items() if n == 0]
        heapq.heapify(heap)
        device_free: dict[str, float] = {}
        end = start
        while heap:
            ready, tid = heapq.heappop(heap)
            task = self.tasks[tid]
            task.start = max(ready, device_free.get(task.device, start))
            task.end = task.start + self.duration[tid]
            device_free[task.device] = task.end
            end = max(end, task.end)
            for child in children.get(tid, ()):
                ready_at[child] = max(ready_at[child], task.end)
                pending[child] -= 1
                if pending[child] == 0:
                    heapq.heappush(heap, (ready_at[child], child))
        return end


def simulate(
    graph: MacroGraph,
    placements: dict[str, Placement],
    device_names: list[str],
    stages: int,
    profile: Profile,
    phases: list[Phase],
) -> Prediction:
    """Predict one steady-state iteration of `phases` (the plan's program) on `placements`."""
    run = _Run(
        graph,
        placements,
        {w: [device_names[d] for d in p.replica_devices] for w, p in placements.items()},
        stages,
        profile,
    )
    for phase in phases:
        run.swaps(phase)
        run.phase(phase)
    return run.prediction()


class _Run:
    """The state of one simulated iteration: the schedule so far, the clock, time per phase."""

    def __init__(
        self,
        graph: MacroGraph,
        placements: dict[str, Placement],
        names: dict[str, list[str]],
        stages: int,
        profile: Profile,
    ):
        self.graph, self.placements, self.names, self.stages, self.profile = graph, placements, names, stages, profile
        self.sched = _Schedule(names)
        self.clock = 0.0
        self.phase_s: dict[str, float] = {}
        self.loop_items, self.steps, self.step_s = 0, 0, 0.0

    def _advance(self, phase: str, first: int, weight: float = 1.0) -> None:
        end = self.sched.run(self.clock, first)
        self.phase_s[phase] = self.phase_s.get(phase, 0.0) + (end - self.clock) * weight
        self.clock = end

    def swaps(self, phase: Phase) -> None:
        first = len(self.sched.tasks)
        for op, workers in (("offload", phase.offload), ("onload", phase.onload)):
            for worker in workers:
                seconds = self.profile.swap_s(worker, self.placements[worker].device_kind)
                for r in range(len(self.names[worker])):
                    self.sched.add(worker, r, op, seconds, "swap", [])
        if len(self.sched.tasks) > first:
            self._advance("swap", first, 1.0 / phase.every)

    def phase(self, phase: Phase) -> None:
        first = len(self.sched.tasks)
        if phase.op == "sync":
            edge = Edge.model_validate(phase.edges[0])
            srcs = [
                self.sched.add(
                    edge.src.worker,
                    r,
                    edge.src.port,
                    self.profile.call_s(edge.src.worker, edge.src.port, 1),
                    "sync",
                    [],
                )
                for r in range(len(self.names[edge.src.worker]))
            ]
            for r in range(len(self.names[edge.dst.worker])):
                self.sched.add(
                    edge.dst.worker,
                    r,
                    edge.dst.port,
                    self.profile.call_s(edge.dst.worker, edge.dst.port, 1),
                    "sync",
                    srcs,
                )
            self._advance("sync", first, 1.0 / phase.every)
        elif phase.op == "loop":
            together = same_process(process_groups(self.graph, self.placements))
            self.loop_items, self.steps = _simulate_loop(
                self.graph, self.names, self.stages, self.profile, self.sched, together
            )
            end_simulated = self.sched.run(self.clock, first)
            per_step = self.step_s = _steady_step_s(_step_ends(self.sched.tasks[first:], self.steps), self.clock)
            loop_s = (end_simulated - self.clock) + per_step * (self.graph.loop.horizon - self.steps)
            self.phase_s["loop"] = loop_s
            self.clock += loop_s
        else:
            produced: dict[str, list[int]] = {}
            total_items = self.loop_items * (self.graph.loop.horizon if self.graph.loop else 1)
            for port in self.graph.then_order:
                deps = [tid for src in self.graph.then_inputs(port) for tid in produced.get(str(src), [])]
                replicas = len(self.names[port.worker])
                items = total_items / replicas if total_items else 1
                seconds = self.profile.call_s(port.worker, port.port, items)
                produced[str(port)] = [
                    self.sched.add(port.worker, r, port.port, seconds, "then", deps) for r in range(replicas)
                ]
            self._advance("then", first)

    def prediction(self) -> Prediction:
        sched, graph, steps = self.sched, self.graph, self.steps
        phase_s = self.phase_s
        iteration_s = sum(phase_s.values())
        total_items = self.loop_items * (graph.loop.horizon if graph.loop else 1)
        busy: dict[str, float] = {}
        for task, seconds in zip(sched.tasks, sched.duration, strict=True):
            busy[task.device] = busy.get(task.device, 0.0) + seconds
        if graph.loop is not None and steps:
            scale = graph.loop.horizon / steps
            for task, seconds in zip(sched.tasks, sched.duration, strict=True):
                if task.phase == "loop" and task.step >= 0:
                    busy[task.device] += seconds * (scale - 1)
        port_s: dict[str, float] = {}
        scale = graph.loop.horizon / steps if graph.loop is not None and steps else 1.0
        for task, seconds in zip(sched.tasks, sched.duration, strict=True):
            weight = scale if task.phase == "loop" and task.step >= 0 else 1.0
            key = f"{task.worker}.{task.port}"
            port_s[key] = port_s.get(key, 0.0) + seconds * weight
        used = sorted(busy)
        device_busy = {d: min(1.0, busy[d] / iteration_s) if iteration_s else 0.0 for d in used}
        bubble = 1.0 - sum(device_busy.values()) / len(used) if used else 0.0
        return Prediction(
            sched.tasks, iteration_s, phase_s, total_items, device_busy, bubble, steps, port_s, self.step_s
        )


def _simulate_loop(
    graph: MacroGraph,
    names: dict[str, list[str]],
    stages: int,
    profile: Profile,
    sched: _Schedule,
    together: dict[tuple[str, int], int],
) -> tuple[int, int]:
    """Add the loop's tasks for the first simulated steps, in each replica's program order; a message
    costs a channel hop unless sender and receiver share a process (`together`)."""
    loop = graph.loop
    entry = loop.entry.worker
    n_shards = len(names[entry])
    items = profile.items_per_replica.get(entry, 1)
    slice_items = slice_sizes(items, stages)
    steps = min(loop.horizon, SIMULATED_STEPS)
    last_of: dict[tuple[str, int], int] = {}  # (worker, replica) -> last task: program order
    produced: dict[tuple[int, int], int] = {}  # (shard, slice) -> task that produced its current data

    def call(port, step, phase="loop"):
        replicas = len(names[port.worker])
        for r, group in enumerate(shard_groups(n_shards, replicas)):
            for s in range(stages):
                deps = [produced[(b, s)] for b in group if (b, s) in produced]
                # a message from each upstream replica of another worker in another process: a channel hop
                me = together.get((port.worker, r), -1)
                hops = len(
                    {
                        sched.tasks[d].replica
                        for d in deps
                        if sched.tasks[d].worker != port.worker
                        and together.get((sched.tasks[d].worker, sched.tasks[d].replica), -2) != me
                    }
                )
                if (port.worker, r) in last_of:
                    deps.append(last_of[(port.worker, r)])
                seconds = profile.call_s(port.worker, port.port, slice_items[s] * len(group)) + hops * profile.hop_s
                tid = sched.add(port.worker, r, port.port, seconds, phase, deps, step, s)
                last_of[(port.worker, r)] = tid
                for b in group:
                    produced[(b, s)] = tid

    call(loop.entry, -1)
    for step in range(steps):
        for port in loop.body:
            call(port, step)
    return items * n_shards, steps


def _step_ends(tasks: list[Task], steps: int) -> list[float]:
    ends = [0.0] * steps
    for task in tasks:
        if 0 <= task.step < steps:
            ends[task.step] = max(ends[task.step], task.end)
    return ends


def _steady_step_s(step_ends: list[float], start: float) -> float:
    """Time per step once the pipeline is full: the slope over the second half of the simulated steps."""
    if not step_ends:
        return 0.0
    if len(step_ends) == 1:
        return step_ends[0] - start
    half = len(step_ends) // 2
    return (step_ends[-1] - step_ends[half - 1]) / (len(step_ends) - half) if half else step_ends[-1] - start
