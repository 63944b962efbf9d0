"""The loop's first steps as predicted tasks: each simulated replica's calls, step by step and slice by slice in
each process's order, a message between processes costing a channel hop and its items; and the steady step time read
from when the simulated steps end. `planners/simulate.py` runs them and extrapolates the rest of the loop."""

from __future__ import annotations

import functools
from collections import Counter

from m2flow.graph import MacroGraph
from m2flow.planners.merging import merge_slices
from m2flow.planners.processes import Processes, process_of
from m2flow.planners.profile import Profile
from m2flow.planners.render import ReplicaPort, ports_of
from m2flow.planners.tasklist import TaskList
from m2flow.schedule import Placement, ReplicaId, Task, execution_id
from m2flow.sharding import shard_groups, slice_sizes
from m2flow.spec import PortRef

SIMULATED_STEPS = 16


def simulate_loop_steps(
    graph: MacroGraph,
    stages: int,
    profile: Profile,
    sched: TaskList,
    together: dict[ReplicaId, int],
    models: set[ReplicaId],
    beside_rendering: frozenset[ReplicaPort],
    item_s: float,
) -> tuple[int, int]:
    """Add the loop's tasks of the replicas in `models` (the others copy them) for the first simulated steps,
    in each process's program order; a message costs a channel hop unless sender and receiver share a process
    (`together`), growing by `item_s` with each item it carries; a replica's port in `beside_rendering` at its
    cost beside rendering.
    Returns the loop's items per step (all replicas') and the steps simulated."""
    loop = graph.loop
    entry = loop.entry.worker
    n_shards = graph.workers[entry].count
    items = profile.items_per_replica.get(entry, 1)
    slice_items = slice_sizes(items, stages)
    steps = min(loop.horizon, SIMULATED_STEPS)
    # a process's last task: a process runs its replicas' calls one at a time in the global (step, port, slice)
    # order (`runtime/loop.py`), so each call of a co-hosted replica waits for its process neighbour's before it
    last_of: dict[ReplicaId | int, int] = {}
    produced: dict[tuple[int, int], int] = {}  # (shard, slice) -> task that produced its current data
    merging = set(merge_slices(graph, profile, stages, ports_of(beside_rendering)))
    groups = {w: shard_groups(n_shards, graph.workers[w].count) for w in loop.workers}
    simulated = {w: sorted(me.replica for me in models if me.worker == w) for w in loop.workers}

    def call(port: PortRef, step: int) -> None:
        for r in simulated[port.worker]:
            me, group = ReplicaId(port.worker, r), groups[port.worker][r]
            process = process_of(together, me)
            for s in range(stages):
                deps = [produced[(b, s)] for b in group if (b, s) in produced]
                # a message from each upstream replica of another worker in another process (a channel hop),
                # carrying the slice of each of its shards in the group
                shards_from = Counter(
                    d
                    for d in deps
                    if sched.tasks[d].worker != port.worker
                    and process_of(together, ReplicaId(sched.tasks[d].worker, sched.tasks[d].replica)) != process
                )
                receiving = sum(profile.hop_s + item_s * slice_items[s] * n for n in shards_from.values())
                if process in last_of:
                    deps.append(last_of[process])
                rows = slice_items[s] * len(group)
                beside = ReplicaPort(ReplicaId(port.worker, r), port.port) in beside_rendering
                seconds = profile.call_s(port.worker, port.port, rows, beside)
                tid = sched.add(port.worker, r, port.port, seconds, "loop", deps, step, s, receiving)
                if str(port) in merging:
                    cost = functools.partial(profile.call_s, port.worker, port.port, beside_rendering=beside)
                    sched.may_merge(tid, rows, cost, last_of[process] if s > 0 else None)
                last_of[process] = tid
                for b in group:
                    produced[(b, s)] = tid

    call(loop.entry, -1)
    for step in range(steps):
        for port in loop.body:
            call(port, step)
    return items * n_shards, steps


def hop_item_s(profile: Profile, placements: dict[str, Placement], stages: int, processes: Processes) -> float:
    """What each item of a loop message costs where the replicas run so: what a run of that execution measured, if
    one did (`execution_id`, worked out only where some run measured one), else the profile's."""
    if not profile.execution_hops:
        return profile.hop_item_s
    return profile.execution_hops.get(execution_id(placements, stages, processes), profile.hop_item_s)


def steady_step_s(tasks: list[Task], steps: int, start: float) -> float:
    """Time per step once the pipeline is full: the slope of the simulated steps' ends (`tasks` run from `start`)
    over the second half of the steps."""
    step_ends = [0.0] * steps
    for task in tasks:
        if 0 <= task.step < steps:
            step_ends[task.step] = max(step_ends[task.step], task.end)
    if not step_ends:
        return 0.0
    if len(step_ends) == 1:
        return step_ends[0] - start
    half = len(step_ends) // 2
    return (step_ends[-1] - step_ends[half - 1]) / (len(step_ends) - half) if half else step_ends[-1] - start
