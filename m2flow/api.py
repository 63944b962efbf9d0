"""The Python API: declare workers and their dataflow, then plan or run. Builds a `WorkflowSpec`."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from m2flow.config import load_spec, spec_from_dict
from m2flow.errors import SpecError
from m2flow.resolve import FUNCTION_PORT, dotted_path, register_object
from m2flow.spec import Edge, PortRef, WorkflowSpec

_defined: dict[str, WorkerHandle] = {}


@dataclass(frozen=True)
class PortHandle:
    worker: str
    port: str

    def __rshift__(self, other: PortHandle) -> Edge:
        if not isinstance(other, PortHandle):
            raise SpecError(
                [f"'{self.worker}.{self.port} >> ...': the right side must be a port, e.g. policy.port('act')"]
            )
        return Edge(src=PortRef(worker=self.worker, port=self.port), dst=PortRef(worker=other.worker, port=other.port))


@dataclass
class WorkerHandle:
    name: str
    config: dict[str, Any]

    def port(self, name: str = FUNCTION_PORT) -> PortHandle:
        return PortHandle(self.name, name)


def define_worker(
    name: str,
    cls: Any = None,
    *,
    func: Any = None,
    kind: str = "function",
    replicas: int = 1,
    args: dict | None = None,
    backend: str | None = None,
    resources: dict | None = None,
    profile: dict | None = None,
    dispatch: dict | None = None,
) -> WorkerHandle:
    """Declare a worker from a class (its public methods are ports) or a function (port `call`), given as the
    object or as its dotted path ("package.module.Name", as YAML's `class:` takes it)."""
    target = cls if cls is not None else func
    if target is None or (cls is not None and func is not None):
        raise SpecError([f"define_worker('{name}'): give exactly one of cls=... or func=..."])
    if func is not None and inspect.isclass(func):
        raise SpecError([f"define_worker('{name}'): func= must be a function; pass classes as cls="])
    path = target if isinstance(target, str) else _path_of(name, target)
    config: dict[str, Any] = {"kind": kind, "class": path, "replicas": replicas, "args": args or {}}
    for key, value in (("backend", backend), ("resources", resources), ("profile", profile), ("dispatch", dispatch)):
        if value is not None:
            config[key] = value
    handle = WorkerHandle(name, config)
    _defined[name] = handle
    return handle


def _path_of(name: str, target: Any) -> str:
    """The dotted path a worker's processes import `target` by (registered, so this process need not)."""
    if not callable(target):
        what = f"{target!r} (of type {type(target).__name__})"
        raise SpecError([f"define_worker('{name}'): {what} is not a class or function"])
    path = dotted_path(target)
    if "<" in path:  # a lambda, or a class or function defined inside a function
        raise SpecError(
            [f"define_worker('{name}'): '{path}' cannot be imported by name; define it at a module's top level"]
        )
    register_object(path, target)
    return path


class Workflow:
    """Workers plus loop / then / sync edges; `spec()` gives the same WorkflowSpec a YAML file does."""

    def __init__(self, name: str, workers: list[WorkerHandle]):
        self.name = name
        self.workers = list(workers)
        for worker in self.workers:
            if not isinstance(worker, WorkerHandle):
                raise SpecError(
                    [f"Workflow('{name}'): {worker!r} is not a worker; list what define_worker(...) returns"]
                )
        names = [w.name for w in self.workers]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise SpecError([f"Workflow('{name}'): worker name(s) {', '.join(twice)} given twice; name each once"])
        self._flow: dict[str, Any] = {"then": [], "sync": []}
        self._placement: dict[str, Any] = {}
        self._cluster: dict[str, Any] = {}

    def loop(self, *edges: Edge, horizon: int) -> Workflow:
        self._flow["loop"] = {"horizon": horizon, "edges": [str(e) for e in edges]}
        return self

    def then(self, *edges: Edge) -> Workflow:
        self._flow["then"] += [str(e) for e in edges]
        return self

    def sync(self, edge: Edge, every: int = 1, transport: str = "auto") -> Workflow:
        self._flow["sync"].append({"edge": str(edge), "every": every, "transport": transport})
        return self

    def asynchronous(self, max_staleness: int = 1, on_stale: str = "block") -> Workflow:
        """Training overlaps the next loops; a batch trains at most `max_staleness` policy versions late,
        the loop waiting for training (`on_stale="block"`) or stale batches dropped (`"drop"`)."""
        self._flow["async"] = {"max_staleness": max_staleness, "on_stale": on_stale}
        return self

    def placement(self, **settings: Any) -> Workflow:
        self._placement.update(settings)
        return self

    def cluster(self, **settings: Any) -> Workflow:
        self._cluster.update(settings)
        return self

    def spec(self, **run: Any) -> WorkflowSpec:
        raw = {
            "name": self.name,
            "workers": {w.name: dict(w.config) for w in self.workers},
            "flow": self._flow,
            "placement": self._placement,
            "cluster": self._cluster,
            "run": {k: v for k, v in run.items() if v is not None},
        }
        return spec_from_dict(raw, f"Workflow('{self.name}')")


def chain(workers: list[str | WorkerHandle], horizon: int, name: str = "chain") -> Workflow:
    """The seed form: a list of function workers is a loop that closes back onto the first."""
    handles = []
    for w in workers:
        if isinstance(w, WorkerHandle):
            handles.append(w)
        elif w in _defined:
            handles.append(_defined[w])
        else:
            known = ", ".join(sorted(_defined)) or "none yet"
            raise SpecError([f"run(workers=[...]): no worker named '{w}' was defined (defined: {known})"])
    if len(handles) < 2:
        raise SpecError(["run(workers=[...]): a chain needs at least two workers, e.g. ['simulator', 'inference']"])
    ports = [h.port() for h in handles] + [handles[0].port()]
    edges = [a >> b for a, b in zip(ports, ports[1:], strict=False)]
    return Workflow(name, handles).loop(*edges, horizon=horizon)


def as_spec(
    workflow: Workflow | WorkflowSpec | str | Path, overrides: list[str] | tuple[str, ...] = ()
) -> WorkflowSpec:
    if isinstance(workflow, WorkflowSpec):
        return workflow
    if isinstance(workflow, Workflow):
        return workflow.spec()
    if not isinstance(workflow, str | Path):
        raise SpecError([f"{workflow!r} is not a workflow: pass a Workflow, a WorkflowSpec or a YAML file's path"])
    return load_spec(workflow, overrides)


def _with(spec: WorkflowSpec, mode: str | None, **run: Any) -> WorkflowSpec:
    raw = spec.to_dict()
    if mode is not None:
        raw["placement"]["mode"] = mode
    raw["run"].update({k: v for k, v in run.items() if v is not None})
    return spec_from_dict(raw, spec.name)


def plan(workflow: Workflow | WorkflowSpec | str | Path, mode: str | None = None):
    """Plan without running: no Ray, no model. Returns the `Plan`."""
    from m2flow.cluster import Cluster
    from m2flow.graph import build_graph
    from m2flow.planners import make_plan

    spec = _with(as_spec(workflow), mode)
    return make_plan(build_graph(spec), Cluster.from_spec(spec.cluster))


def run(
    workflow: Workflow | WorkflowSpec | str | Path | None = None,
    *,
    workers: list | None = None,
    mode: str | None = None,
    iterations: int | None = None,
    horizon: int = 16,
    **run_settings: Any,
):
    """Plan and execute on Ray. `run(workers=[...])` runs the seed-style chain of function workers."""
    from m2flow.runtime.executor import execute

    if workers is not None:
        if workflow is not None:
            raise SpecError(["run(): give a workflow or workers=[...], not both"])
        workflow = chain(workers, horizon)
    if workflow is None:
        raise SpecError(["run(): give a Workflow, a WorkflowSpec, a YAML path, or workers=[...]"])
    return execute(_with(as_spec(workflow), mode, iterations=iterations, **run_settings))
