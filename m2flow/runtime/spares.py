"""Spare processes for replacements in place (`run.spares`): a replaced replica's new process costs the
start of a Python process and its imports (torch alone takes seconds), paid while the loop waits. A spare
pays it ahead: a process started beside the replicas it may stand in for, in their device's bundle, that
imports in a thread of its own at the lowest priority (it takes no CPU from the job) the modules those
replicas imported, and becomes a replica's host (builds the worker, joins its group) when one fails. Each
spare used is followed by a new one.

Spares stand by for replicas on CPU cores: a process on a GPU sees its GPU only if Ray gave it a share of
it when it started, and a spare holds no share of a device (the replicas hold the whole of it)."""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from m2flow.cluster import DeviceId
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
    """Replicas one spare may stand in for: of one worker, on one device, with one process environment."""

    worker: str
    device: DeviceId
    env: tuple[tuple[str, str], ...]


@dataclass
class Spare:
    actor: Any
    ready: Any  # the reference that ends when its process has started and imported


class Spares:
    """One spare process per `SpareKey` of the replicas it stands by for; `start(key)` starts one,
    `take(key)` hands one over if it has started (then starts its successor)."""

    def __init__(self, start: Callable[[SpareKey, int], Any]):
        self._start = start  # (key, its number) -> a SpareHost actor
        self._spares: dict[SpareKey, Spare] = {}
        self._started = 0

    def stand_by(self, keys: list[SpareKey]) -> None:
        for key in dict.fromkeys(keys):
            if key.device.kind == "cpu" and key not in self._spares:
                self._add(key)

    def _add(self, key: SpareKey) -> None:
        self._started += 1
        actor = self._start(key, self._started)
        self._spares[key] = Spare(actor, actor.ready.remote())

    def take(self, key: SpareKey) -> Any | None:
        """The spare for `key` if it is ready (None: start a fresh process); a new spare for it either way."""
        import ray

        spare = self._spares.pop(key, None)
        if spare is None:
            return None
        started = bool(ray.wait([spare.ready], timeout=0)[0])
        if started:
            with contextlib.suppress(ray.exceptions.RayError):
                ray.get(spare.ready)
                self._add(key)
                return spare.actor
        ray.kill(spare.actor, no_restart=True)  # still starting, or it died: a fresh process for this one
        self._add(key)
        return None

    def close(self) -> None:
        import ray

        for spare in self._spares.values():
            ray.kill(spare.actor, no_restart=True)
        self._spares.clear()
