"""Chrome / Perfetto trace of what ran where: one process row per device, one thread per replica."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import NamedTuple

from m2flow.cluster import DeviceId
from m2flow.planners.trace_calls import STARTED
from m2flow.schedule import Plan

CONTROLLER = "controller"


class TaskEvent(NamedTuple):
    """One task as a host records it: a port call, a swap, or a controller phase."""

    name: str
    phase: str
    start: float
    end: float
    step: int = -1
    stage: int = 0
    items: int = 0
    bytes: int = 0

    @property
    def seconds(self) -> float:
        return self.end - self.start


class Trace:
    def __init__(self, plan: Plan):
        self.plan = plan
        self.events: list[dict] = []
        self._pid = {d.name: i + 1 for i, d in enumerate(plan.cluster.devices)}
        self._tid: dict[str, int] = {}
        self._named: set[tuple[int, int]] = set()
        self._pid[CONTROLLER] = 0

    def task(self, row: str, device: DeviceId | str, event: TaskEvent, **args) -> None:
        device = device.name if isinstance(device, DeviceId) else device
        pid, tid = self._row(row, device)
        extra = {"step": event.step, "stage": event.stage} if event.step >= 0 else {}
        self.events.append(
            {
                "name": event.name,
                "cat": event.phase,
                "ph": "X",
                "pid": pid,
                "tid": tid,
                "ts": event.start * 1e6,
                "dur": max(0.0, event.seconds) * 1e6,
                "args": {"worker": row, "device": device, "items": event.items, "bytes": event.bytes, **extra, **args},
            }
        )

    def started(self, plan: Plan, iteration: int) -> None:
        """A mark across every row where the workers started under `plan` (the run's start, a re-plan's switch, a
        restart), `iteration` their first: a warm-up, which a fit of the trace leaves out (`trace_calls.started_at`)."""
        pid, tid = self._row(CONTROLLER, CONTROLLER)
        self.events.append(
            {
                "name": f"workers started: {plan.label}",
                "cat": STARTED,
                "ph": "i",
                "s": "g",
                "pid": pid,
                "tid": tid,
                "ts": time.time() * 1e6,
                "args": {"iteration": iteration, "plan": plan.label},
            }
        )

    def _row(self, row: str, device: str) -> tuple[int, int]:
        """The trace's process and thread of `row` on `device`, named the first time."""
        pid, tid = self._pid.get(device, 0), self._tid.setdefault(row, len(self._tid) + 1)
        if (pid, tid) not in self._named:
            self._named.add((pid, tid))
            self.events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": row}})
        return pid, tid

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        names = [
            {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": device}}
            for device, pid in self._pid.items()
        ]
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"traceEvents": names + self.events, "displayTimeUnit": "ms"}))
        tmp.replace(path)
        return path
