"""Port costs measured by earlier runs, kept for the next ones.

A cost depends on what runs (the worker's class and its args) and on what it runs on (device kind; for a simulator with
cameras on the cores of a cluster with GPUs, that a GPU draws its frames), so that is the key; `m2flow run` stores what
it measured, and `m2flow plan` and later runs start from it instead of the defaults. A port's costs at each batch size
accumulate over runs (a run at another slice size adds its size), so that the per-call and per-item parts are fitted
apart once two sizes were seen.

A cost measured on a busy machine moves from run to run (the main job's step by 0.7-1.5x on the 2-core
machine, benchmarks/RESULTS.md), so a size's cost is the median of what the last `RUNS_KEPT` runs that ran
it measured, and a message's cost per item and the controller's time likewise: once three runs are kept, one slow run
moves a cost no further than the other kept runs spread (with fewer, part of the way), and a lasting change is
followed once most of the kept runs saw it. A run that saves again (at its re-plan, then at its end) replaces
what it saved before. One small JSON file per worker key, written atomically, under
`$M2FLOW_COST_CACHE` (default `~/.cache/m2flow/costs`).
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from m2flow.cluster import cpus_per_node
from m2flow.graph import MacroGraph, threads_refusal
from m2flow.planners.fit import PortFit, SizeMean, latest_shares, line_through_means, residual
from m2flow.spec import PortCost

RUNS_KEPT = 5  # a cost is the median of what this many of the latest runs measured
# a calibration value's key: what each item of a loop message cost in a run of one execution (`execution_id`)
EXECUTION_HOP = "hop_item_s of "
EXECUTIONS_KEPT = 32  # the executions whose hops the calibration keeps: those of the latest runs


@dataclass(frozen=True)
class Seen:
    """What one run measured of one quantity: a port's mean cost over `calls` calls at one batch size
    (`items`), or a calibration value (no items, one value)."""

    run: str
    value: float
    items: float = 0.0
    calls: int = 1


def _parsed(rows: object, fallback: list[Seen]) -> list[Seen]:
    """Rows as the cache wrote them, or `fallback` where they are not (an entry written before runs were kept,
    or damaged: what it holds is measured again, never a crash at a run's end)."""
    try:
        return [
            Seen(str(row["run"]), float(row["value"]), float(row.get("items", 0.0)), int(row.get("calls", 1)))
            for row in rows
        ]
    except (TypeError, ValueError, KeyError, AttributeError):
        return fallback


@dataclass(frozen=True)
class CachedFit:
    """A port's fit as the cache keeps it: across what the kept runs measured of it (`seen`; none for a fit with
    no batch sizes to keep apart). On disk: the fit's JSON object with a `seen` key beside its own, where it has
    rows."""

    fit: PortFit
    seen: tuple[Seen, ...] = ()

    def to_dict(self) -> dict:
        entry = self.fit.to_dict()
        if self.seen:
            entry["seen"] = [asdict(row) for row in self.seen]
        return entry

    @classmethod
    def from_dict(cls, data: dict) -> CachedFit | None:
        """An entry as `to_dict` wrote it, or None where its fit does not read as one (damaged: measured again).
        Where its `seen` rows do not read as such (an entry written before runs were kept, or damaged), the fit's
        mean at each batch size reads as one earlier run's."""
        try:
            fit = PortFit.from_dict(data)
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        legacy = [Seen("", row.mean_s, row.items, row.calls) for row in fit.by_size]
        return cls(fit, tuple(_parsed(data.get("seen"), legacy)))


def new_run() -> str:
    """An id for one run's saves to the cache: a run saving again replaces what it saved before."""
    return uuid.uuid4().hex


def _kept(seen: list[Seen], run: str, now: list[Seen], runs_kept: int) -> list[Seen]:
    """`seen` less what `run` saved before, plus `now`; of each batch size, the latest `runs_kept`."""
    rows = [row for row in seen if row.run != run] + now
    sizes = sorted({row.items for row in rows})
    return [row for items in sizes for row in [r for r in rows if r.items == items][-runs_kept:]]


def cache_dir() -> Path:
    return Path(os.environ.get("M2FLOW_COST_CACHE", Path.home() / ".cache" / "m2flow" / "costs"))


def _digest(what: dict) -> str:
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:24]


def worker_key(graph: MacroGraph, worker: str, device_kind: str) -> str:
    """Its class, backend, device kind and args, less the items one replica serves (envs per process, which the
    planner may set: a cost per item carries over, and the batch sizes are kept per entry); on CPUs, where a
    replica may compute on several cores (`resources.threads`), what decides how many: the value declared, the
    cores of a node and the worker's replicas (a call on two cores costs what it measured on two)."""
    spec = graph.workers[worker]
    args = _without_knobs(graph, worker, {"args": spec.args})["args"]
    key = {"class": spec.cls, "args": args, "backend": spec.backend, "device": device_kind}
    threads = spec.resources.threads
    if device_kind != "gpu" and threads != 1 and not threads_refusal(graph.spec, worker):
        key["threads"] = [threads, cpus_per_node(graph.spec.cluster), spec.count]
    return _digest(key)


def workflow_key(graph: MacroGraph) -> str:
    """What a run's own overheads depend on: its workers and their dataflow (not its run settings, nor the
    replicas and envs per replica the planner may set: a run on the planner's choice and the next run, which
    plans again, share it; nor `flow.async`: an asynchronous flow measures on its synchronous twin, whose re-plan
    reads what the flow's earlier runs cached)."""
    spec = graph.spec.to_dict()
    workers = {name: _without_knobs(graph, name, worker) for name, worker in spec["workers"].items()}
    flow = graph.spec.flow.model_copy(update={"asynchronous": None}).model_dump(mode="json", by_alias=True)
    return "workflow-" + _digest({"workers": workers, "flow": flow, "cluster": spec["cluster"]})


def _without_knobs(graph: MacroGraph, name: str, worker: dict) -> dict:
    """`worker`'s spec less what the planner may set, and `resources.threads` (a key of its worker's costs, not of
    the run's overheads)."""
    items = graph.info[name].items_field
    args = {key: value for key, value in worker.get("args", {}).items() if key != items}
    kept = {key: value for key, value in worker.items() if key != "replicas"}
    if isinstance(kept.get("resources"), dict):
        kept["resources"] = {key: value for key, value in kept["resources"].items() if key != "threads"}
    return {**kept, "args": args}


def load_calibration(graph: MacroGraph) -> dict[str, float]:
    """A message's cost per item and the controller time per iteration earlier runs of this workflow measured (the
    median of the last `RUNS_KEPT` runs' values)."""
    return _calibration_entry(graph).get("calibration", {})


def _calibration_entry(graph: MacroGraph) -> dict:
    try:
        entry = json.loads((cache_dir() / f"{workflow_key(graph)}.json").read_text())
        return entry if isinstance(entry.get("calibration"), dict) else {}
    except (OSError, ValueError, AttributeError):
        return {}


def save_calibration(
    graph: MacroGraph, calibration: dict[str, float], run: str | None = None, runs_kept: int = RUNS_KEPT
) -> Path:
    """Keep `calibration`, what run `run` (default: a run of its own) measured, beside what earlier runs
    measured: each value the median of the latest `runs_kept` runs' values; of the executions' hops, those the
    latest `EXECUTIONS_KEPT` saved (a plan no recent run ran is priced at the workflow's hop again)."""
    run = run or new_run()
    entry = _calibration_entry(graph)
    earlier = entry.get("calibration", {})
    seen = entry.get("seen")
    history = {key: kept for key, rows in seen.items() if (kept := _parsed(rows, []))} if isinstance(seen, dict) else {}
    for key, value in calibration.items():  # each moved last: the latest runs' values come last
        before = history.pop(key, None) or _parsed([{"run": "", "value": earlier.get(key)}], [])
        history[key] = _kept(before, run, [Seen(run, value)], runs_kept)
    values = {key: value for key, value in earlier.items() if key not in history}
    values.update({key: statistics.median(row.value for row in rows) for key, rows in history.items()})
    for key in [key for key in values if key.startswith(EXECUTION_HOP)][:-EXECUTIONS_KEPT]:
        del values[key]
        history.pop(key, None)
    seen = {key: [asdict(row) for row in rows] for key, rows in history.items()}
    return _write(
        cache_dir() / f"{workflow_key(graph)}.json", {"workflow": graph.spec.name, "calibration": values, "seen": seen}
    )


def _write(path: Path, entry: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(entry, indent=1))
    tmp.replace(path)
    return path


def load_cached(graph: MacroGraph, device_kinds: dict[str, str]) -> dict[str, PortFit]:
    """`worker.port` -> the fit earlier runs measured for this worker on this device kind."""
    return {port: cached.fit for port, cached in cached_fits(graph, device_kinds).items()}


def cached_fits(graph: MacroGraph, device_kinds: dict[str, str]) -> dict[str, CachedFit]:
    """`worker.port` -> what earlier runs measured of it: the fit, its batch sizes and its mean cost at each."""
    return {
        f"{worker}.{port}": cached
        for worker, kind in device_kinds.items()
        for port, entry in _cached_ports(graph, worker, kind).items()
        if (cached := CachedFit.from_dict(entry)) is not None
    }


def _cached_ports(graph: MacroGraph, worker: str, kind: str) -> dict[str, dict]:
    """Port -> the fit earlier runs cached for this worker on this device kind, as JSON; {} if none (or an
    unreadable entry: measured again)."""
    try:
        ports = json.loads(_entry(graph, worker, kind).read_text())["ports"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return {port: fit for port, fit in ports.items() if isinstance(fit, dict)} if isinstance(ports, dict) else {}


def _entry(graph: MacroGraph, worker: str, kind: str) -> Path:
    return cache_dir() / f"{worker_key(graph, worker, kind)}.json"


def save_cached(
    graph: MacroGraph,
    device_kinds: dict[str, str],
    fitted: dict[str, PortFit],
    run: str | None = None,
    runs_kept: int = RUNS_KEPT,
) -> list[Path]:
    """Store fitted costs (`worker.port` -> its fit), what run `run` (default: a run of its own) measured, under
    each worker's key, beside what the latest `runs_kept` earlier runs measured (`remembered`); the worker's
    other ports stay as they were written."""
    run = run or new_run()
    written = []
    for worker, kind in device_kinds.items():
        ports = {key.split(".", 1)[1]: fit for key, fit in fitted.items() if key.split(".", 1)[0] == worker}
        if not ports:
            continue
        previous = _cached_ports(graph, worker, kind)
        earlier = {port: CachedFit.from_dict(previous[port]) for port in ports if port in previous}
        now = {port: remembered(earlier.get(port), fit, run, runs_kept).to_dict() for port, fit in ports.items()}
        entry = {"class": graph.workers[worker].cls, "device": kind, "ports": {**previous, **now}}
        written.append(_write(_entry(graph, worker, kind), entry))
    return written


def remembered(earlier: CachedFit | None, fit: PortFit, run: str, runs_kept: int = RUNS_KEPT) -> CachedFit:
    """A port's cached fit once `fit`, run `run`'s, joins what earlier runs measured (`earlier`): at each batch
    size the median of the latest `runs_kept` runs' means there; across sizes the line through those medians
    (`line_through_means`: its per-call part shrunk by how uncertain it is; one
    size: `fit`'s split between per-call and per-item cost, scaled to the median); its residual, how far the kept
    runs' means scatter around it. `fit` stands as it is where no other run measured it (its residual: how far
    its calls scatter)."""
    fit = replace(fit, replica_shares=latest_shares(earlier.fit if earlier else None, fit))
    now = [Seen(run, row.mean_s, row.items, row.calls) for row in fit.by_size]
    if not now:
        return CachedFit(fit)  # no batch sizes to keep apart (a fit written down elsewhere)
    seen = _kept(list(earlier.seen) if earlier else [], run, now, runs_kept)
    if all(row.run == run for row in seen):
        return CachedFit(fit, tuple(seen))
    sizes = sorted({row.items for row in seen})
    medians = [(items, statistics.median(r.value for r in seen if r.items == items)) for items in sizes]
    calls = {items: sum(r.calls for r in seen if r.items == items) for items in sizes}
    if len(medians) > 1:
        line = line_through_means(medians)
    else:
        ((items, median),) = medians
        scale = median / now[0].value if now[0].value > 0 else 1.0
        line = PortCost(fixed_s=fit.fixed_s * scale, per_item_s=fit.per_item_s * scale)
    fitted = PortFit(
        fixed_s=line.fixed_s,
        per_item_s=line.per_item_s,
        calls=sum(calls.values()),
        batch_sizes=tuple(int(items) for items in sizes),
        by_size=tuple(SizeMean(items, mean, calls[items]) for items, mean in medians),
        residual=residual([(row.items, row.value) for row in seen], line),
        replica_shares=fit.replica_shares,
    )
    return CachedFit(fitted, tuple(seen))
