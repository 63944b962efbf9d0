"""Event simulator: a candidate placement -> the predicted micro schedule of one iteration.

It interprets the same program the executor runs (`m2flow.program`: phases in order, each op calling
ports with the same dispatch rules), adding a predicted task for every call instead of a Ray call.
Inside the loop every replica calls its ports step by step and slice by slice (`planners/loop_steps.py`), a
process its replicas' calls one at a time; a task runs once its inputs exist, in turn on a GPU and sharing a CPU
core with the other processes there (`planners/tasklist.py`). A port of `merge_slices` takes into a call the next
slices of the same step whose inputs all exist when its process is free to call, as the executor's loop takes in
those whose messages have arrived.
Long loops are compressed: the first steps are simulated and the steady-state step time extrapolates the rest;
and of the loop's components that are copies of one another only one is simulated (`planners/symmetry.py`).
A phase outside the loop depends on no stage count, the loop's components only on whether ports run beside
rendering (`planners/render.py`: in plans of two stages or more): the simulations of one placement's candidates
with one process layout share them (`Shared`, `planners/simulation_cache.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from m2flow.cluster import DeviceId
from m2flow.dispatch import gather, split
from m2flow.graph import MacroGraph
from m2flow.overlap import Overlap
from m2flow.planners.loop_steps import hop_item_s, simulate_loop_steps, steady_step_s
from m2flow.planners.processes import Processes, same_process
from m2flow.planners.profile import Profile
from m2flow.planners.render import ReplicaPort, beside_rendering
from m2flow.planners.simulation_cache import PhaseRecord, Shared
from m2flow.planners.symmetry import LoopClass
from m2flow.planners.tasklist import TaskList
from m2flow.program import own_items, run_phase
from m2flow.schedule import Phase, Placement, Plan, Prediction, ReplicaId, Task
from m2flow.spec import PortRef


@dataclass
class Simulated:
    """A candidate's predicted iteration, and its micro schedule written out on demand (a search weighs many
    candidates and keeps few: only theirs get the copied components' tasks)."""

    prediction: Prediction
    stages: int
    micro_schedule: Callable[[], list[Task]]

    def tasks(self) -> list[Task]:
        """Every replica's tasks: the simulated ones and the copies of the loop's components."""
        return self.micro_schedule()


def simulation(
    graph: MacroGraph,
    placements: dict[str, Placement],
    stages: int,
    profile: Profile,
    phases: list[Phase],
    processes: Processes,
    shared: Shared | None = None,
    *,
    beside_rendering: frozenset[ReplicaPort],
) -> Simulated:
    """Predict one steady-state iteration of `phases` (the plan's program) on `placements`, the replicas
    in `processes` sharing theirs. Given what the simulations of these placements and phases share, each phase
    outside the loop (but one beside it) is taken from there, or run and recorded there, and so are the loop's
    components. The replicas' loop ports in `beside_rendering` cost what they cost beside rendering on their GPU
    (`planners/render.py`), where a run measured that."""
    shared = shared or Shared()
    shared.check((graph, placements, profile, phases))
    run = _Simulation(graph, placements, stages, profile, processes, shared, beside_rendering)
    layout = tuple(tuple(group) for group in processes)
    for index, phase in enumerate(phases):
        if phase.op == "loop" or phase.overlaps:
            run_phase(phase, run)
        elif (layout, index) in shared.outside:
            run.replay(shared.outside[(layout, index)])
        else:
            shared.outside[(layout, index)] = run.recorded(phase)
    if not run.replayed:
        return Simulated(run.prediction(), stages, run.micro_schedule)
    costs = profile.copy()  # as they are now: the tasks are written out later, if at all

    def every_task() -> list[Task]:  # the replayed phases' tasks: those of a simulation that runs them all
        return simulation(
            graph, placements, stages, costs, phases, processes, beside_rendering=beside_rendering
        ).tasks()

    return Simulated(run.prediction(), stages, every_task)


def simulate_plan(graph: MacroGraph, plan: Plan, profile: Profile) -> Simulated:
    """`plan`'s placements, stages, program and processes simulated on `profile`'s costs."""
    beside = beside_rendering(graph, plan.placements, plan.pipeline_stages, plan.cluster)
    return simulation(
        graph, plan.placements, plan.pipeline_stages, profile, plan.phases, plan.processes, beside_rendering=beside
    )


def sends_messages(graph: MacroGraph, plan: Plan, profile: Profile) -> bool:
    """Whether `plan`'s loop sends messages between processes (co-hosted replicas send none to each other): only
    then does what a message costs change its time, and only then can a run's loop time say what one costs."""
    if graph.loop is None:
        return False
    loops = []
    for item_s in (0.0, 1e-3):
        priced = profile.copy()
        priced.execution_hops = {plan.execution: item_s}
        loops.append(simulate_plan(graph, plan, priced).prediction.phase_s["loop"])
    return loops[1] > loops[0]


class _Simulation:
    """The program's interpreter that predicts: handles are task ids, each carrying its items."""

    def __init__(
        self,
        graph: MacroGraph,
        placements: dict[str, Placement],
        stages: int,
        profile: Profile,
        processes: Processes,
        shared: Shared,
        beside_rendering: frozenset[ReplicaPort],
    ):
        self.graph, self.placements, self.stages, self.profile = graph, placements, stages, profile
        self.processes, self.shared, self.beside_rendering = processes, shared, beside_rendering
        self.together = same_process(processes)
        self.hop_item_s = hop_item_s(profile, placements, stages, processes)
        self.devices = {w: p.replica_devices for w, p in placements.items()}
        self.sched = TaskList(self.devices, self.together)
        self.items: dict[int, float] = {}  # task id -> items (env steps) its output carries
        self.clock = 0.0
        self.first = 0  # the current phase's first task
        self.phase_s: dict[str, float] = {}
        self.loop_items, self.steps, self.step_s = 0, 0, 0.0
        self.beside: tuple[int, float] | None = None  # an overlapping phase's first task and its seconds
        self.hidden_s = 0.0
        self.trains_one_in = 1  # drop mode: loops per training
        self.loop_tasks = range(0)  # the ids of the loop's tasks
        self.classes: list[LoopClass] = []  # the loop's components: one simulated per class, the others copy it
        self.models: set[ReplicaId] = set()  # the loop replicas simulated: the first component of each class
        self.copies: dict[ReplicaId, int] = {}  # a simulated loop replica -> how many replicas copy it
        self.expanded = False
        self.advances: list[tuple[str, float, float]] = []  # every phase time added to, in order (`PhaseRecord`)
        self.replayed: list[PhaseRecord] = []  # the phases taken from another simulation: their tasks are not here
        self.iteration_share: dict[int, float] = {}  # task id -> the share of iterations it runs in (sync every k)

    # -- phases outside the loop, shared by a placement's simulations --------------------------------
    def recorded(self, phase: Phase) -> PhaseRecord:
        """Run `phase` and record what it adds."""
        first_advance, first_task = len(self.advances), len(self.sched.tasks)
        run_phase(phase, self)
        busy: dict[DeviceId, float] = {}
        port_s: dict[str, float] = {}
        sched = self.sched
        for task, seconds, receiving in zip(
            sched.tasks[first_task:], sched.duration[first_task:], sched.receiving[first_task:], strict=True
        ):
            own = (seconds - receiving) * self.iteration_share.get(task.id, 1.0)
            busy[task.device] = busy.get(task.device, 0.0) + own
            key = f"{task.worker}.{task.port}"
            port_s[key] = port_s.get(key, 0.0) + own
        return PhaseRecord(self.advances[first_advance:], busy, port_s)

    def replay(self, record: PhaseRecord) -> None:
        """Add what a recorded phase added, in the same order."""
        for key, seconds, clock_s in record.advances:
            self._add_phase_time(key, seconds, self.clock + clock_s)
        self.replayed.append(record)

    # -- the interpreter ---------------------------------------------------------------------------
    def swap(self, phase: Phase) -> None:
        first = len(self.sched.tasks)
        for op, workers in (("offload", phase.offload), ("onload", phase.onload)):
            for worker in workers:
                seconds = self.profile.swap_s(worker, self.placements[worker].device_kind)
                for r in range(len(self.devices[worker])):
                    self.sched.add(worker, r, op, seconds, "swap", [])
        if len(self.sched.tasks) > first:
            self._advance("swap", first, 1.0 / phase.every)
        self.first = len(self.sched.tasks)

    def call(self, port: PortRef, inputs: list[list[int]], phase: Phase) -> list[int]:
        info = self.graph.info[port.worker]
        rule = info.dispatch(port.port)
        per_replica = [split(rule, handles, info.replicas, info.data_parallel) for handles in inputs]
        outputs = []
        totals: dict[tuple[int, ...], float] = {}  # a broadcast's receivers share one input list: sum it once
        for r in range(info.replicas):
            mine = [h for edge in per_replica for h in edge[r]]
            key = tuple(mine)
            if key not in totals:
                totals[key] = sum(self.items[h] for h in mine)
            items = totals[key] if mine else own_items(self.graph, port.worker, r, phase.op)
            seconds = self.profile.replica_call_s(ReplicaId(port.worker, r), port.port, items, info.replicas)
            tid = self.sched.add(port.worker, r, port.port, seconds, phase.op, mine)
            self.items[tid] = items
            outputs.append(tid)
        return gather(rule, outputs)

    def copy_state(self, port: PortRef, state: int, phase: Phase) -> None:
        info = self.graph.info[port.worker]
        receivers = info.state_receivers(port.port)
        for r in receivers:
            # every replica called: each its measured share of the cost; some only (`first`): a call's whole cost
            seconds = (
                self.profile.replica_call_s(ReplicaId(port.worker, r), port.port, 1, info.replicas)
                if len(receivers) == info.replicas
                else self.profile.call_s(port.worker, port.port, 1)
            )
            self.sched.add(port.worker, r, port.port, seconds, phase.op, [state])

    def loop(self, phase: Phase) -> None:
        self.classes = self.shared.classes(self.graph, self.devices, self.processes, self.beside_rendering)
        self.models = {me for loop_class in self.classes for me in loop_class.model.replicas}
        self.copies = {me: len(c.copies) for c in self.classes for me in c.model.replicas}
        self.loop_items, self.steps = simulate_loop_steps(
            self.graph,
            self.stages,
            self.profile,
            self.sched,
            self.together,
            self.models,
            self.beside_rendering,
            self.hop_item_s,
        )
        self.loop_tasks = range(self.first, len(self.sched.tasks))
        end_simulated = self.sched.run(self.clock, self.first)
        steady_s = steady_step_s(self.sched.tasks[self.first :], self.steps, self.clock)
        per_step = self.step_s = max(steady_s, self._busiest_device_step_s())
        loop_s = (end_simulated - self.clock) + per_step * (self.graph.loop.horizon - self.steps)
        self.phase_s["loop"] = loop_s
        if self.beside is not None:  # training beside the loop: whichever is longer, or a device both load
            asynchronous = self.graph.spec.flow.asynchronous
            if asynchronous.on_stale == "drop":  # the loop never waits: training holds ceil(train/loop) loops
                self.trains_one_in = Overlap.of(asynchronous).trains_one_in(loop_s, self.beside[1])
            share = 1.0 / self.trains_one_in
            busiest = max(self._busy_beside_loop(share).values(), default=0.0)
            together = max(loop_s, self.beside[1] * share, busiest)
            self.hidden_s = loop_s + self.beside[1] - together
            loop_s = together
        self.clock += loop_s

    def _busiest_device_step_s(self) -> float:
        """The most work one device does for a simulated step's tasks (in turn, or sharing a core): no steady
        step is shorter, though the slope of the simulated steps' ends can be, where the last steps end before
        their device's next work (a replica running ahead of another on its device)."""
        per_device: dict[DeviceId, float] = {}
        for task, seconds in zip(self.sched.tasks[self.first :], self.sched.duration[self.first :], strict=True):
            if 0 <= task.step < self.steps:
                per_device[task.device] = per_device.get(task.device, 0.0) + seconds
        return max(per_device.values(), default=0.0) / self.steps if self.steps else 0.0

    def streamed(self, phase: Phase) -> dict[PortRef, list[int]]:
        return {}  # the overlap of streamed parts with the loop is not credited

    def end_phase(self, phase: Phase, produced: dict[PortRef, list[int]]) -> None:
        if phase.overlaps:  # it runs beside the loop that follows: timed with it, from the same clock
            seconds = self.sched.run(self.clock, self.first) - self.clock
            self.phase_s[phase.op] = seconds
            self.beside = (self.first, seconds)
        elif phase.op != "loop":
            self._advance(phase.op, self.first, 1.0 / phase.every)

    def _busy_beside_loop(self, share: float) -> dict[DeviceId, float]:
        """Per device, the seconds the overlapping phase (`share` of it per loop) and the whole loop keep it
        busy together; on a device both load, their work takes `profile.beside_slowdown` times as long. A call's
        receiving of its inputs (a channel hop) is its process's host work: counted on a core, left out on a GPU."""
        first, loop_first = self.beside[0], self.first
        scale = self.graph.loop.horizon / self.steps if self.steps else 1.0
        busy: dict[DeviceId, float] = {}
        in_loop_s: dict[DeviceId, float] = {}
        loads: dict[DeviceId, set[bool]] = {}  # per device: whether the loop, the phase beside it, or both load it
        sched = self.sched
        for task, duration, receiving in zip(
            sched.tasks[first:], sched.duration[first:], sched.receiving[first:], strict=True
        ):
            seconds = duration - receiving if task.device.kind == "gpu" else duration
            in_loop = task.id >= loop_first
            weight = (scale if task.step >= 0 else 1.0) if in_loop else share
            busy[task.device] = busy.get(task.device, 0.0) + seconds * weight
            if in_loop:
                in_loop_s[task.device] = in_loop_s.get(task.device, 0.0) + seconds * weight
            loads.setdefault(task.device, set()).add(in_loop)
        for device in self._add_copies(busy, in_loop_s):
            loads.setdefault(device, set()).add(True)
        slowdown = self.profile.beside_slowdown
        return {device: s * (slowdown if len(loads[device]) == 2 else 1.0) for device, s in busy.items()}

    # -- bookkeeping -------------------------------------------------------------------------------
    def _add_copies(self, busy: dict[DeviceId, float], in_loop_s: dict[DeviceId, float]) -> list[DeviceId]:
        """Add to `busy` the loop seconds of the copied components' devices, each as its model's device has
        them (`in_loop_s`); the devices added to."""
        added = []
        for loop_class in self.classes:
            for copy in loop_class.copies:
                for model_device, device in zip(loop_class.model.devices, copy.devices, strict=True):
                    busy[device] = busy.get(device, 0.0) + in_loop_s.get(model_device, 0.0)
                    added.append(device)
        return added

    def micro_schedule(self) -> list[Task]:
        """Every task, the copies' too, each with a dependency list of its own (the scheduler shared them)."""
        if not self.expanded:
            for task in self.sched.tasks:
                task.deps = list(task.deps)
            self.sched.copy_classes(self.loop_tasks, self.classes)
            self.expanded = True
        return self.sched.tasks

    def _advance(self, phase: str, first: int, weight: float = 1.0) -> None:
        """Run the tasks from `first` on, the phase they make up running in `weight` of the iterations: its time
        and its tasks' work count that share in each iteration."""
        end = self.sched.run(self.clock, first)
        self._add_phase_time(phase, (end - self.clock) * weight, end)
        if weight != 1.0:
            self.iteration_share.update(dict.fromkeys(range(first, len(self.sched.tasks)), weight))

    def _add_phase_time(self, phase: str, seconds: float, end: float) -> None:
        """`seconds` more of `phase`, which ended at `end`."""
        self.advances.append((phase, seconds, end - self.clock))
        self.phase_s[phase] = self.phase_s.get(phase, 0.0) + seconds
        self.clock = end

    def prediction(self) -> Prediction:
        if self.expanded:  # the copies are in the task list now: their time would count twice
            raise RuntimeError("prediction() after tasks(): the copied components' time would count twice")
        sched, graph, steps = self.sched, self.graph, self.steps
        self.phase_s["controller"] = self.profile.controller_s
        iteration_s = sum(self.phase_s.values()) - self.hidden_s
        total_items = self.loop_items * (graph.loop.horizon if graph.loop else 1)
        scale = graph.loop.horizon / steps if graph.loop is not None and steps else 1.0
        busy: dict[DeviceId, float] = {}
        in_loop_s: dict[DeviceId, float] = {}
        port_s: dict[str, float] = {}
        for task, seconds, receiving in zip(sched.tasks, sched.duration, sched.receiving, strict=True):
            weight = scale if task.phase == "loop" and task.step >= 0 else 1.0
            if task.phase == "then" and self.beside is not None:  # drop mode trains one loop's batch in several
                weight = 1.0 / self.trains_one_in
            weight *= self.iteration_share.get(task.id, 1.0)
            own = (seconds - receiving) * weight  # the task's own work, as a trace measures it: no receiving
            busy[task.device] = busy.get(task.device, 0.0) + own
            copies = self.copies.get(ReplicaId(task.worker, task.replica), 0) if task.id in self.loop_tasks else 0
            if copies:
                in_loop_s[task.device] = in_loop_s.get(task.device, 0.0) + own
            key = f"{task.worker}.{task.port}"
            port_s[key] = port_s.get(key, 0.0) + own * (1 + copies)
        self._add_copies(busy, in_loop_s)
        for record in self.replayed:  # outside the loop: weighed once
            for device, seconds in record.busy.items():
                busy[device] = busy.get(device, 0.0) + seconds
            for key, seconds in record.port_s.items():
                port_s[key] = port_s.get(key, 0.0) + seconds
        used = sorted(busy)
        device_busy = {d: min(1.0, busy[d] / iteration_s) if iteration_s else 0.0 for d in used}
        bubble = 1.0 - sum(device_busy.values()) / len(used) if used else 0.0
        return Prediction(
            iteration_s,
            self.phase_s,
            total_items,
            device_busy,
            bubble,
            steps,
            port_s,
            self.step_s,
            hidden_s=self.hidden_s,
            trains_one_in=self.trains_one_in,
        )
