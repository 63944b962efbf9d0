"""Fit port costs `fixed_s + per_item_s * items` to measured calls: from a run's trace or a profiling run.

A call's cost is the work it did. Where calls ran at once on one CPU slot (two simulator replicas pinned
to one core, a streamed training part beside a step), the core shared its time among them, and each
call's wall time counts the others' work too; such a call's work is its wall time with every moment
divided by the number of calls then running on that core (processor sharing). The planner's event
simulator then runs them one after another on the core, as the core really did the work.

Pure computation over m2flow's own Chrome trace format; no Ray, no torch.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

from m2flow.cluster import DeviceId
from m2flow.errors import PlanError
from m2flow.schedule import BESIDE_RENDERING, ReplicaId
from m2flow.spec import PortCost

Points = dict[str, list[tuple[float, float]]]  # "worker.port" -> [(items, seconds), ...]
ReplicaPoints = dict[str, dict[int, list[tuple[float, float]]]]  # "worker.port" -> replica -> [(items, seconds)]
ReplicaShares = dict[int, tuple[float, ...]]  # a replica count -> each replica's share of a call's cost there

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


@dataclass(frozen=True)
class SizeMean:
    """A port's mean cost at one batch size: `calls` calls of `items` items each took `mean_s` on average."""

    items: float
    mean_s: float
    calls: int


@dataclass(frozen=True)
class PortFit:
    """A port's cost `fixed_s + per_item_s * items` fitted to `calls` measured calls at `batch_sizes`, its mean at
    each (`by_size`, the smallest first) and how far what it was fitted to scatters around it (`residual`: the calls,
    or in the cost cache the kept runs' means). A port called outside the loop keeps, per replica count it was
    measured at, what each replica's calls cost against the line (`replica_shares`: `(2.0, 0.0)` at 2 replicas, the
    first does all of it, as an evaluation on replica 0 alone). On disk: a JSON object with these keys, `by_size`
    as `[items, mean_s, calls]` rows, `replica_shares` as `{"2": [2.0, 0.0]}`."""

    fixed_s: float
    per_item_s: float
    calls: int = 0
    batch_sizes: tuple[int, ...] = ()
    by_size: tuple[SizeMean, ...] = ()
    residual: float = 0.0
    replica_shares: ReplicaShares = field(default_factory=dict)

    @property
    def cost(self) -> PortCost:
        """The fitted line, as the planner's profile holds a port's cost."""
        return PortCost(fixed_s=self.fixed_s, per_item_s=self.per_item_s)

    def to_dict(self) -> dict:
        return {
            "fixed_s": self.fixed_s,
            "per_item_s": self.per_item_s,
            "calls": self.calls,
            "batch_sizes": list(self.batch_sizes),
            "by_size": [[row.items, row.mean_s, row.calls] for row in self.by_size],
            "residual": self.residual,
            "replica_shares": {str(count): list(shares) for count, shares in self.replica_shares.items()},
        }

    @classmethod
    def from_dict(cls, data: dict) -> PortFit:
        """A fit as `to_dict` wrote it; a key it lacks besides its cost (a fit written down by hand, or before the
        key existed) reads as nothing measured. Raises KeyError without `fixed_s` or `per_item_s`, TypeError or
        ValueError where a value does not read as its field."""
        return cls(
            fixed_s=float(data["fixed_s"]),
            per_item_s=float(data["per_item_s"]),
            calls=int(data.get("calls", 0)),
            batch_sizes=tuple(int(size) for size in data.get("batch_sizes", [])),
            by_size=tuple(
                SizeMean(float(items), float(mean_s), int(calls)) for items, mean_s, calls in data.get("by_size", [])
            ),
            residual=float(data.get("residual", 0.0)),
            replica_shares=_shares_read(data.get("replica_shares", {})),
        )


def _shares_read(data: dict) -> ReplicaShares:
    """`replica_shares` as `to_dict` wrote them; ValueError where a count's shares are not that many."""
    shares = {int(count): tuple(float(share) for share in values) for count, values in data.items()}
    if any(len(values) != count for count, values in shares.items()):
        raise ValueError(f"replica_shares {data}: a replica count's shares are not that many")
    return shares


def fit_line(points: list[tuple[float, float]], prior_fixed: float = 0.0) -> PortCost:
    """Least squares `fixed_s + per_item_s * items` with non-negative coefficients. Seen at one batch size
    only, the split between the two cannot be measured: `prior_fixed` (a fraction of the cost there) is
    taken as the per-call part."""
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mean_x) ** 2 for x in xs)
    if var == 0:
        if mean_x <= 0:
            return PortCost(fixed_s=mean_y, per_item_s=0.0)
        return PortCost(fixed_s=prior_fixed * mean_y, per_item_s=(1 - prior_fixed) * mean_y / mean_x)
    slope = max(0.0, sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / var)
    fixed = mean_y - slope * mean_x
    if fixed < 0:
        return PortCost(fixed_s=0.0, per_item_s=sum(x * y for x, y in points) / sum(x * x for x in xs))
    return PortCost(fixed_s=fixed, per_item_s=slope)


# How far one run's mean cost of a port at a batch size may lie from another run's: on the 2-core machine a step
# moved 0.7-1.5x between runs (planners/cache.py), and the medians the cache keeps narrow that.
RUN_SCATTER = 0.1


def line_through_means(means: list[tuple[float, float]]) -> PortCost:
    """The line through a port's mean cost at each batch size seen (`(items, mean_s)`), its per-call part shrunk
    toward none by how uncertain it is. Each mean came from other runs, of other process layouts, and may be off
    by `RUN_SCATTER` of itself; a per-call part read from two sizes carries that noise magnified (at sizes 4 and 8,
    twice the first mean less the second), and a plan slicing below the sizes seen pays it once per slice. So the
    per-call part a is scaled by a^2 / (a^2 + v), v its variance under that noise: a part as large as its noise
    keeps half of itself, one far above it (a GPU kernel's flat cost) nearly all. The line keeps its cost at the
    sizes' mean. A cost that does not grow with the batch is all per call and kept as it is: its per-call part is
    the means' mean, not a line's intercept. Not toward the worker kind's default share: scaled to a measured cost,
    a simulator's 4% became a per-call part of 2.18 ms where the sizes showed none (benchmarks/RESULTS.md, the
    dec06b sweep)."""
    line = fit_line(means)
    if len({x for x, _ in means}) < 2 or line.fixed_s <= 0 or line.per_item_s == 0:
        return line
    xs = [x for x, _ in means]
    mean_x, mean_y = sum(xs) / len(xs), sum(y for _, y in means) / len(means)
    spread = sum((x - mean_x) ** 2 for x in xs)
    weights = [1 / len(means) - mean_x * (x - mean_x) / spread for x in xs]  # intercept = a weighted sum of the means
    variance = sum((w * RUN_SCATTER * y) ** 2 for w, (_, y) in zip(weights, means, strict=True))
    fixed = line.fixed_s * line.fixed_s**2 / (line.fixed_s**2 + variance)
    return PortCost(fixed_s=fixed, per_item_s=(mean_y - fixed) / mean_x)


def residual(points: list[tuple[float, float]], line: PortCost) -> float:
    """The line's root-mean-square error relative to the mean cost (0.1: calls scatter by ~10% around it)."""
    mean_y = sum(y for _, y in points) / len(points)
    squares = sum((y - line.fixed_s - line.per_item_s * x) ** 2 for x, y in points) / len(points)
    return squares**0.5 / mean_y if mean_y > 0 else 0.0


def fit_points(
    points: Points, source: str, priors: dict[str, float] | None = None, by_replica: ReplicaPoints | None = None
) -> dict:
    """`{"source": source, "ports": {port: PortFit}}`; `priors[port]` is its per-call fraction when it was seen at
    one batch size only; `by_replica[port]`, its calls replica by replica (`replica_points`), gives its shares."""
    ports = {}
    for port, samples in sorted(points.items()):
        line = fit_line(samples, (priors or {}).get(port, 0.0))
        ports[port] = PortFit(
            fixed_s=line.fixed_s,
            per_item_s=line.per_item_s,
            calls=len(samples),
            batch_sizes=tuple(sorted({int(x) for x, _ in samples})),
            by_size=by_size(samples),
            residual=residual(samples, line),
            replica_shares=shares_of((by_replica or {}).get(port, {}), line),
        )
    return {"source": source, "ports": ports}


def shares_of(by_replica: dict[int, list[tuple[float, float]]], line: PortCost) -> ReplicaShares:
    """Each replica's work over what `line` gives its calls (1.0: as the line; the items each call carried are the
    line's to count, not the share's), at the replica count seen; none where no replica was seen."""
    shares = []
    for replica in range(len(by_replica)):
        calls = by_replica[replica]
        expected = sum(line.fixed_s + line.per_item_s * items for items, _ in calls)
        shares.append(sum(seconds for _, seconds in calls) / expected if expected > 0 else 1.0)
    return {len(shares): tuple(shares)} if shares else {}


def by_size(points: list[tuple[float, float]]) -> tuple[SizeMean, ...]:
    """The mean cost at each batch size seen, the smallest first."""
    seen: dict[float, list[float]] = defaultdict(list)
    for items, seconds in points:
        seen[items].append(seconds)
    return tuple(SizeMean(items, sum(costs) / len(costs), len(costs)) for items, costs in sorted(seen.items()))


def merged(earlier: PortFit | None, fit: PortFit) -> PortFit:
    """A port's fit over the batch sizes an earlier fit saw and those `fit` saw: where both saw a size, the
    later mean stands. Seen at several sizes, the line through their means splits the per-call cost from the
    per-item one, which one size alone cannot (a camera simulator rendering on a GPU costs about the same
    per call for half its envs: a pipelined plan's slices are not half as cheap; `line_through_means`)."""
    rows = {row.items: row for row in earlier.by_size} if earlier else {}
    own = {row.items for row in fit.by_size}
    if not own or set(rows) <= own:
        return replace(fit, replica_shares=latest_shares(earlier, fit))  # nothing seen earlier at another size
    rows.update({row.items: row for row in fit.by_size})
    ordered = tuple(rows[items] for items in sorted(rows))
    means = [(row.items, row.mean_s) for row in ordered]
    line = line_through_means(means)
    return PortFit(
        fixed_s=line.fixed_s,
        per_item_s=line.per_item_s,
        calls=sum(row.calls for row in ordered),
        batch_sizes=tuple(int(items) for items, _ in means),
        by_size=ordered,
        residual=residual(means, line),
        replica_shares=latest_shares(earlier, fit),
    )


class Start(NamedTuple):
    """Where a trace's workers started (a `Trace.started` mark): the first iteration they ran, under which plan."""

    iteration: int
    plan: str


def started_at(events: list[dict]) -> list[Start]:
    """Where a trace's workers started, in order."""
    return [Start(e["args"]["iteration"], e["args"]["plan"]) for e in events if e.get("cat") == STARTED]


def latest_shares(earlier: PortFit | None, fit: PortFit) -> ReplicaShares:
    """The replicas' shares of a port's cost at each replica count, as the latest fit that measured them there has
    them."""
    return {**(earlier.replica_shares if earlier else {}), **fit.replica_shares}


def fit_trace_file(path: str | Path, ports: Collection[str]) -> dict:
    """The fits of a run's trace.json (`m2flow profile --from-trace`) for `ports` ("worker.port"), the workflow's; a
    PlanError where the file cannot be read or holds no call of them."""
    try:
        trace = json.loads(Path(path).read_text())
    except OSError as exc:
        raise PlanError(f"--from-trace: cannot read {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise PlanError(f"--from-trace: {path} is not a trace (not JSON: {exc}); give a run's trace.json") from None
    try:  # each start of the workers' first iteration warmed up, as the run left it out
        points = points_from_trace(trace, warmups=[start.iteration for start in started_at(trace["traceEvents"])])
    except (TypeError, KeyError, AttributeError, ValueError):
        raise PlanError(f"--from-trace: {path} is JSON but not a trace m2flow wrote; give a run's trace.json") from None
    if not any(port in ports for port in points):
        raise PlanError(
            f"--from-trace: {path} holds no call of this workflow's ports; give the trace of a run of this workflow"
        )
    return fit_points(points, f"trace {path}")


def save_profile(profile: dict, path: str | Path) -> Path:
    """Write a profile (`fit_points`' with what `m2flow profile` adds: workflow, hop_s, hop_item_s) as JSON, its
    fits as `PortFit.to_dict` writes them."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    ports = {port: fit.to_dict() for port, fit in profile["ports"].items()}
    tmp.write_text(json.dumps({**profile, "ports": ports}, indent=1))
    tmp.replace(path)
    return path


def load_profile(path: str | Path) -> dict:
    """A profile `save_profile` wrote, its fits read back as `PortFit`s; a fit that does not read as one is refused,
    naming the file and the port."""
    profile = json.loads(Path(path).read_text())
    ports = {}
    for port, fit in profile.get("ports", {}).items():
        try:
            ports[port] = PortFit.from_dict(fit)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise PlanError(
                f"{path}: ports.{port} does not read as a measured cost ({type(exc).__name__}: {exc}); run"
                " `m2flow profile` again, or fix or delete the file"
            ) from None
    return {**profile, "ports": ports}
