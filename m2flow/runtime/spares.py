"""Spare processes for replacements in place (`run.spares`): a replaced replica's new process costs the
start of a Python process and its imports (torch alone takes seconds), paid while the loop waits. A spare
pays it ahead: a process started beside the replicas it may stand in for, on their node, that imports, in
a thread of its own at the lowest priority, the third-party modules those replicas imported, and becomes
a replica's host (builds the worker, pinned to the replica's core, and joins its group) when one fails.
The spare's own start (Python, Ray's worker) runs at normal priority. A spare used is followed by a new
one once the iteration's replacements are done (`refill`); one not ready yet is passed over, not lost.

Spares stand by for replicas on CPU cores: a process on a GPU sees its GPU only if Ray gave it a share of
it when it started, and a spare holds no share of a device (the replicas hold the whole of it)."""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from m2flow.runtime.host import WorkerHost

LOWEST_PRIORITY = 19  # nice value of the thread that imports


def _import_quietly(modules: list[str]) -> None:
    """Import `modules` in order in this thread, at the lowest priority (a thread's nice value is its own
    on Linux); one that fails to import here is left to the worker to report as it builds."""
    with contextlib.suppress(OSError, AttributeError):  # AttributeError: no setpriority on this platform
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LOWEST_PRIORITY)
    for module in modules:
        with contextlib.suppress(Exception):
            importlib.import_module(module)


class SpareHost(WorkerHost):
    """A host process started ahead of a failure; `become` makes it a replica's host, as `WorkerHost`
    would have been built (it returns the replica's `info`)."""

    def __init__(self, modules: list[str]):  # noqa: D107 - no replica yet: WorkerHost's state comes in `become`
        self._warming = threading.Thread(target=_import_quietly, args=(modules,), daemon=True)
        self._warming.start()

    def ready(self) -> bool:
        """Ends once its imports are done: a spare is handed over only then (its build never imports beside
        the warming thread)."""
        self._warming.join()
        return True

    def become(self, *host_args: Any) -> dict:
        WorkerHost.__init__(self, *host_args)
        return self.info()


@dataclass(frozen=True)
class SpareKey:
    """Replicas a spare may stand in for: of one worker, on one node, with one process environment; `bundle`:
    the device whose placement-group bundle holds it (one of theirs, on that node)."""

    worker: str
    node: int
    env: tuple[tuple[str, str], ...]
    bundle: Any = field(compare=False, hash=False)


@dataclass
class Spare:
    actor: Any
    ready: Any  # the reference that ends when its process has started and imported


class Spares:
    """`stand_by({key: n})` keeps n spare processes for each key (a training worker's ranks restart
    together: one each); `take(key)` hands over a ready one; `refill()` replaces those taken or dead."""

    def __init__(self, start: Callable[[SpareKey, int], Any]):
        self._start = start  # (key, its number) -> a SpareHost actor
        self._spares: dict[SpareKey, list[Spare]] = {}
        self._wanted: dict[SpareKey, int] = {}
        self._started = 0

    def stand_by(self, wanted: dict[SpareKey, int]) -> None:
        self._wanted.update(wanted)
        self.refill()

    def refill(self) -> None:
        """Start spares where fewer stand by than wanted."""
        for key, count in self._wanted.items():
            standing = self._spares.setdefault(key, [])
            while len(standing) < count:
                self._started += 1
                actor = self._start(key, self._started)
                standing.append(Spare(actor, actor.ready.remote()))

    def take(self, key: SpareKey) -> Any | None:
        """A ready spare for `key`, no longer standing by (None: none is ready; one still importing stays);
        a dead one is dropped, for `refill` to replace."""
        import ray

        for spare in list(self._spares.get(key, [])):
            if not ray.wait([spare.ready], timeout=0)[0]:
                continue
            self._spares[key].remove(spare)
            try:
                ray.get(spare.ready, timeout=0)
            except ray.exceptions.RayError:
                continue  # it died standing by
            return spare.actor
        return None

    def close(self) -> None:
        import ray

        for spare in (s for standing in self._spares.values() for s in standing):
            ray.kill(spare.actor, no_restart=True)
        self._spares.clear()
        self._wanted.clear()
