"""Port costs measured by earlier runs, kept for the next ones.

A cost depends on what runs (the worker's class and its args) and on what it runs on (device kind), so
that is the key; `m2flow run` stores what it measured, and `m2flow plan` and later runs start from it
instead of the defaults. A port's costs at each batch size accumulate over runs (a run at another slice
size adds its size), so that the per-call and per-item parts are fitted apart once two sizes were seen.
One small JSON file per worker key, written atomically, under `$M2FLOW_COST_CACHE` (default
`~/.cache/m2flow/costs`).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from m2flow.graph import MacroGraph
from m2flow.planners.fit import merged
from m2flow.spec import PortCost


def cache_dir() -> Path:
    return Path(os.environ.get("M2FLOW_COST_CACHE", Path.home() / ".cache" / "m2flow" / "costs"))


def _digest(what: dict) -> str:
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:24]


def worker_key(graph: MacroGraph, worker: str, device_kind: str) -> str:
    """Its class, backend, device kind and args, less the items one replica serves (envs per process, which the
    planner may set: a cost per item carries over, and the batch sizes are kept per entry)."""
    spec = graph.workers[worker]
    args = _without_knobs(graph, worker, {"args": spec.args})["args"]
    return _digest({"class": spec.cls, "args": args, "backend": spec.backend, "device": device_kind})


def workflow_key(graph: MacroGraph) -> str:
    """What a run's own overheads depend on: its workers and their dataflow (not its run settings, nor the
    replicas and envs per replica the planner may set: a run on the planner's choice and the next run, which
    plans again, share it)."""
    spec = graph.spec.to_dict()
    workers = {name: _without_knobs(graph, name, worker) for name, worker in spec["workers"].items()}
    return "workflow-" + _digest({"workers": workers, "flow": spec["flow"], "cluster": spec["cluster"]})


def _without_knobs(graph: MacroGraph, name: str, worker: dict) -> dict:
    items = graph.info[name].items_field
    args = {key: value for key, value in worker.get("args", {}).items() if key != items}
    return {**{key: value for key, value in worker.items() if key != "replicas"}, "args": args}


def load_calibration(graph: MacroGraph) -> dict[str, float]:
    """The message hop and controller time per iteration an earlier run of this workflow measured."""
    try:
        return json.loads((cache_dir() / f"{workflow_key(graph)}.json").read_text())["calibration"]
    except (OSError, ValueError, KeyError):
        return {}


def save_calibration(graph: MacroGraph, calibration: dict[str, float]) -> Path:
    """Keep `calibration` for this workflow, beside what earlier runs measured of it that this one did not."""
    entry = {"workflow": graph.spec.name, "calibration": {**load_calibration(graph), **calibration}}
    return _write(cache_dir() / f"{workflow_key(graph)}.json", entry)


def _write(path: Path, entry: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(entry, indent=1))
    tmp.replace(path)
    return path


def load_cached(graph: MacroGraph, device_kinds: dict[str, str]) -> dict[str, PortCost]:
    """`worker.port` -> the cost an earlier run measured for this worker on this device kind."""
    return {
        port: PortCost(fixed_s=fit.get("fixed_s", 0.0), per_item_s=fit.get("per_item_s", 0.0))
        for port, fit in cached_fits(graph, device_kinds).items()
    }


def cached_fits(graph: MacroGraph, device_kinds: dict[str, str]) -> dict[str, dict]:
    """`worker.port` -> what earlier runs measured of it: the fit, its batch sizes and its mean cost at each."""
    return {
        f"{worker}.{port}": fit
        for worker, kind in device_kinds.items()
        for port, fit in _cached_ports(graph, worker, kind).items()
    }


def _cached_ports(graph: MacroGraph, worker: str, kind: str) -> dict[str, dict]:
    """Port -> the fit earlier runs cached for this worker on this device kind; {} if none (or an unreadable
    entry: measured again)."""
    try:
        return json.loads(_entry(graph, worker, kind).read_text())["ports"]
    except (OSError, ValueError, KeyError):
        return {}


def _entry(graph: MacroGraph, worker: str, kind: str) -> Path:
    return cache_dir() / f"{worker_key(graph, worker, kind)}.json"


def save_cached(graph: MacroGraph, device_kinds: dict[str, str], fitted: dict[str, dict]) -> list[Path]:
    """Store fitted costs (`worker.port` -> {fixed_s, per_item_s, ...}) under each worker's key."""
    written = []
    for worker, kind in device_kinds.items():
        ports = {key.split(".", 1)[1]: fit for key, fit in fitted.items() if key.split(".", 1)[0] == worker}
        if not ports:
            continue
        previous = _cached_ports(graph, worker, kind)
        ports = {port: merged(previous.get(port, {}), fit) for port, fit in ports.items()}
        entry = {"class": graph.workers[worker].cls, "device": kind, "ports": {**previous, **ports}}
        written.append(_write(_entry(graph, worker, kind), entry))
    return written
