"""What a worker may ask the runtime: who it is, its seed, its device, its slice of the loop batch.

This is the whole public worker interface. A worker stays a plain class; it calls `m2flow.context()`
in `__init__` if it needs any of this. Outside a run, `context()` returns a single-process default.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class WorkerContext:
    worker: str = "local"
    kind: str = "function"
    replica: int = 0
    replicas: int = 1
    stage: int = 0
    stages: int = 1
    items: tuple[int, int] = (0, 1)
    replica_items: tuple[int, int] = (0, 1)
    seed: int = 0
    device: str = "cpu"
    backend: str | None = None
    output_dir: str = "."
    iterations: int = 1  # the run's planned iterations (schedules such as learning-rate annealing read it)

    @property
    def rank(self) -> int:
        return self.replica

    @property
    def world_size(self) -> int:
        return self.replicas

    def with_(self, **changes) -> WorkerContext:
        return replace(self, **changes)


_current = WorkerContext()


def context() -> WorkerContext:
    return _current


def set_context(ctx: WorkerContext) -> None:
    global _current
    _current = ctx
