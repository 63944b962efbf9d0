"""A run's trace read as measured calls: each worker port's (items, seconds of work), the controller's phase
times, the hop between a loop port and the next, where the workers started.

A call's cost is the work it did. Where calls ran at once on one CPU slot (two simulator replicas pinned
to one core, a streamed training part beside a step), the core shared its time among them, and each
call's wall time counts the others' work too; such a call's work is its wall time with every moment
divided by the number of calls then running on that core (processor sharing). The planner's event
simulator then runs them one after another on the core, as the core really did the work.

Pure computation over m2flow's own Chrome trace format; no Ray, no torch. `planners/fit.py` fits lines to what it
reads.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterator
from typing import NamedTuple

from m2flow.cluster import DeviceId
from m2flow.schedule import BESIDE_RENDERING, ReplicaId

Points = dict[str, list[tuple[float, float]]]  # "worker.port" -> [(items, seconds), ...]


ReplicaPoints = dict[str, dict[int, list[tuple[float, float]]]]  # "worker.port" -> replica -> [(items, seconds)]


# a batch size a port runs after it ran others: its first calls at it left out of a fit, the first everywhere (a
# shape's allocations), the second too on a GPU (the first captured a CUDA graph, the second, that graph's first
# replay, uploaded it: 19 and 7.7 ms where the next took 3.3, an H100); a size seen once more is fitted
NEW_SHAPE_CALLS = {"cpu": 1, "gpu": 2}


SKIP_CATEGORIES = {"phase", "iteration"}  # controller rows: not a worker's port


WORK_CATEGORIES = {"loop", "call"}  # calls that compute; a weight sync or swap may wait on its peer instead


STARTED = "start"  # the category of the marks where a run's workers started (`Trace.started`)


def points_from_trace(trace: dict, skip_iterations: int = 1, warmups: Collection[int] = ()) -> Points:
    """(items, seconds of work) per worker port from every traced task, leaving out the first `skip_iterations`
    and the `warmups` (the first iteration of workers started again: a plan switched to, a restart), whose
    calls compile, capture and allocate, and a replica's first calls at a batch size its port had not run before,
    after it ran at others (`NEW_SHAPE_CALLS`: merged slices, a CUDA graph captured for the new shape, then uploaded
    to the GPU by its first replay). Calls that shared a core count their own work (module doc)."""
    points: Points = defaultdict(list)
    for task, items, seconds in _measured_calls(trace, skip_iterations, warmups):
        points[_fit_key(task)].append((items, seconds))
    return dict(points)


def replica_points(
    trace: dict, replicas: dict[str, int], skip_iterations: int = 1, warmups: Collection[int] = ()
) -> ReplicaPoints:
    """Per port called outside the loop, each replica's (items, seconds of work) of the calls `points_from_trace`
    keeps, where every one of its worker's `replicas[worker]` replicas (two or more) was seen. Inside the loop
    replicas step alike (the simulation copies one replica's steps to its peers)."""
    seen: dict[str, dict[int, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    for task, items, seconds in _measured_calls(trace, skip_iterations, warmups):
        if task.get("cat") != "loop":
            seen[_fit_key(task)][traced_replica(task).replica].append((items, seconds))
    return {
        port: dict(by_replica)
        for port, by_replica in seen.items()
        if set(by_replica) == set(range(replicas.get(port.split(".")[0], 0))) and len(by_replica) > 1
    }


def _measured_calls(trace: dict, skip_iterations: int, warmups: Collection[int]) -> Iterator[tuple[dict, float, float]]:
    """(task, items, seconds of work) of each traced call a fit reads (`points_from_trace`), in time order."""
    tasks = _port_tasks(trace)
    # (replica, port) -> calls at each batch size it ran, the first size's as None (it warmed up in its iteration)
    sizes_run: dict[tuple[str, str], dict[float, int | None]] = defaultdict(dict)
    for task, seconds in sorted(zip(tasks, _work_s(tasks), strict=True), key=lambda pair: pair[0].get("ts", 0)):
        args = task["args"]
        items = float(args.get("items", 0))
        run = sizes_run[(args["worker"], task["name"])]
        calls = run.setdefault(items, 0 if run else None)
        if calls is not None:
            run[items] = calls + 1
        new_shape = calls is not None and calls < NEW_SHAPE_CALLS["cpu" if _is_core(args.get("device", "")) else "gpu"]
        iteration = args.get("iteration", skip_iterations)
        if not (iteration < skip_iterations or iteration in warmups or new_shape):
            yield task, items, seconds


def traced_replica(task: dict) -> ReplicaId:
    """The replica a traced task's row is of (`env[1]` -> env's replica 1)."""
    worker, index = task["args"]["worker"].rstrip("]").split("[")
    return ReplicaId(worker, int(index))


def work_share(trace: dict) -> dict[str, float]:
    """Per worker port, its traced calls' work over their wall time (1.0: they never shared a core), to read
    the wall time measured of its other calls as work."""
    tasks = _port_tasks(trace)
    wall: dict[str, float] = defaultdict(float)
    work: dict[str, float] = defaultdict(float)
    for task, seconds in zip(tasks, _work_s(tasks), strict=True):
        wall[_port(task)] += task["dur"] / 1e6
        work[_port(task)] += seconds
    return {port: work[port] / seconds for port, seconds in wall.items() if seconds > 0}


def _port_tasks(trace: dict) -> list[dict]:
    """The traced calls of workers' ports (not the controller's rows, not a loop's one-bar summary)."""
    return [
        event
        for event in trace.get("traceEvents", [])
        if event.get("ph") == "X"
        and event.get("cat") not in SKIP_CATEGORIES
        and "worker" in event.get("args", {})
        and not event["name"].endswith("(busy)")
    ]


def rendering_key(port: str) -> str:
    """The key of `port`'s (`worker.port`) cost beside rendering on its GPU (`planners/render.py`)."""
    return port + BESIDE_RENDERING


def port_of_key(key: str) -> str:
    """The port a cost's key is of: `rollout.act beside rendering` -> `rollout.act`."""
    return key.removesuffix(BESIDE_RENDERING)


def _fit_key(task: dict) -> str:
    """What a traced call's cost is fitted as: its port, or its port beside rendering where the run traced it so
    (`planners/render.py`)."""
    return rendering_key(_port(task)) if task["args"].get("beside_rendering") else _port(task)


def _port(task: dict) -> str:
    return f"{traced_replica(task).worker}.{task['name']}"


def _work_s(tasks: list[dict]) -> list[float]:
    """Each traced task's work in seconds: its wall time, where calls running at once on its CPU slot share
    each moment equally among them. A task on a GPU, one that may wait rather than compute (a weight sync),
    or one without a time or device keeps its wall time and takes no share."""
    work = [task["dur"] / 1e6 for task in tasks]
    on_core: dict[str, list[int]] = defaultdict(list)
    for i, task in enumerate(tasks):
        device = task["args"].get("device")
        if "ts" in task and device and task.get("cat") in WORK_CATEGORIES and _is_core(device):
            on_core[device].append(i)
    for indices in on_core.values():
        shared = _shared_time([(tasks[i]["ts"] / 1e6, (tasks[i]["ts"] + tasks[i]["dur"]) / 1e6) for i in indices])
        for i, seconds in zip(indices, shared, strict=True):
            work[i] = seconds
    return work


def _shared_time(intervals: list[tuple[float, float]]) -> list[float]:
    """For intervals on one core, the integral over each of 1 / (the number of intervals open then): F(end) -
    F(start), F accumulated in one sweep over the boundaries."""
    changes: dict[float, int] = defaultdict(int)
    for start, end in intervals:
        changes[start] += 1
        changes[end] -= 1
    shared_until: dict[float, float] = {}
    accumulated, open_, last = 0.0, 0, None
    for t in sorted(changes):
        if open_ > 0:
            accumulated += (t - last) / open_
        shared_until[t] = accumulated
        open_ += changes[t]
        last = t
    return [shared_until[end] - shared_until[start] for start, end in intervals]


def _is_core(device: str) -> bool:
    try:
        return DeviceId.parse(device).kind == "cpu"
    except ValueError:  # not a device of the plan (the controller's rows)
        return False


def controller_seconds(trace: dict, name: str, skip_iterations: int = 1) -> list[float]:
    """Seconds each traced iteration (`name="iteration"`) or phase (`"loop"`, ...) took, as the controller saw
    it, leaving out the warm-up iterations."""
    return [
        event["dur"] / 1e6
        for event in trace.get("traceEvents", [])
        if event.get("cat") in ("iteration", "phase")
        and event.get("name") == name
        and event.get("args", {}).get("iteration", 0) >= skip_iterations
    ]


def hop_from_trace(trace: dict, chain: list[str], skip_iterations: int = 1) -> float | None:
    """Seconds from a loop port's output to the next port's start on another worker, when that worker was
    waiting for it: the low quartile of those gaps (busy consumers only add queueing, not transfer)."""
    ends: dict[tuple, float] = {}
    starts: list[tuple[tuple, float, str]] = []
    for event in trace.get("traceEvents", []):
        args = event.get("args", {})
        if event.get("ph") != "X" or event.get("cat") != "loop" or "step" not in args:
            continue
        if args.get("iteration", 0) < skip_iterations:
            continue
        worker = traced_replica(event).worker
        key = (f"{worker}.{event['name']}", args["iteration"], args["step"], args["stage"])
        ends[key] = max(ends.get(key, 0.0), (event["ts"] + event["dur"]) / 1e6)
        starts.append((key, event["ts"] / 1e6, worker))
    gaps = []
    for (port, it, step, stage), start, worker in starts:
        j = chain.index(port) if port in chain else -1
        if j < 1:
            continue
        previous = chain[j - 1] if j > 1 else chain[-1]
        producer = (previous, it, step if j > 1 else step - 1, stage)
        if producer in ends and previous.split(".")[0] != worker and start > ends[producer]:
            gaps.append(start - ends[producer])
    if not gaps:
        return None
    return sorted(gaps)[len(gaps) // 4]


class Start(NamedTuple):
    """Where a trace's workers started (a `Trace.started` mark): the first iteration they ran, under which plan."""

    iteration: int
    plan: str


def started_at(events: list[dict]) -> list[Start]:
    """Where a trace's workers started, in order."""
    return [Start(e["args"]["iteration"], e["args"]["plan"]) for e in events if e.get("cat") == STARTED]
