"""What a worker may ask the runtime: who it is, its seed, its device, its slice of the loop batch.

This is the whole public worker interface. A worker stays a plain class; it calls `m2flow.context()`
in `__init__` if it needs any of this. Outside a run, `context()` returns a single-process default.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

RESEED_STRIDE = 1_000_003  # a quarantined env's seed moves by this per quarantine: past every env's and
# evaluation episode's own seed


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
    quarantined: Mapping[int, int] = field(default_factory=dict)  # env -> times
    gpu_memory_gb: float | None = None  # on a GPU that processes share, the most its process may hold; None: all
    threads: int = 1  # the cores this replica computes on (`resources.threads`): torch's intra-op threads
    collective_s: float = 1800.0  # the most one collective of the worker's process groups may take: the plan's
    # deadline in a run; outside one, torch's default of 30 minutes

    @property
    def collective_timeout(self) -> datetime.timedelta:
        """`collective_s` as torch.distributed (and megatron-core) take it: every group the worker makes."""
        return datetime.timedelta(seconds=self.collective_s)

    def env_seed(self, env: int, offset: int | None = None, shared_by: Iterable[int] = ()) -> int:
        """The seed global env `env` starts from: run.seed + `offset` (default: the env's index), moved on for
        each time the runtime quarantined the env (it kept failing with the seeds it had). Envs that share
        one seed (a GRPO group: `shared_by`, `env` among them) move together, as often as the most
        quarantined of them, so they keep sharing it."""
        moves = max((self.quarantined.get(e, 0) for e in (*shared_by, env)), default=0)
        return self.seed + (env if offset is None else offset) + RESEED_STRIDE * moves

    def working_on(self, env: int) -> WorkingOn:
        """`with ctx.working_on(env): ...` around a reset, step or render of global env `env` in a simulator:
        should the process crash inside (a segfault in the physics engine, an abort in the renderer), the
        crash counts against that env, as an `m2flow.EnvFailed` it raised would (`run.quarantine_after`).
        Outside a run it does nothing."""
        return WorkingOn(env)

    @property
    def rank(self) -> int:
        return self.replica

    @property
    def world_size(self) -> int:
        return self.replicas

    def with_(self, **changes) -> WorkerContext:
        return replace(self, **changes)


class WorkingOn:
    """The env a process works on, noted where it outlives a crash (`WorkerContext.working_on`); on exit, the
    env of the block it is nested in, if any (one block may be entered again inside itself). One note per
    process: the thread that entered last holds it."""

    __slots__ = ("env", "outer")

    def __init__(self, env: int):
        self.env, self.outer = env, []

    def __enter__(self) -> None:
        global _working
        self.outer.append(_working)
        _working = self.env
        _note_env(self.env)

    def __exit__(self, *exc: object) -> None:
        global _working
        _working = self.outer.pop()
        _note_env(_working)


_working: int | None = None  # the env this process works on now
_note_env: Callable[[int | None], None] = lambda env: None  # noqa: E731 - set in a worker process by the runtime
_current = WorkerContext()


def context() -> WorkerContext:
    return _current


def set_context(ctx: WorkerContext) -> None:
    global _current
    _current = ctx


def set_env_note(note: Callable[[int | None], None]) -> None:
    """Where `WorkerContext.working_on` notes the env (`m2flow.runtime.crashes`)."""
    global _note_env
    _note_env = note
