"""Chrome / Perfetto trace of what ran where: one process row per device, one thread per replica."""

from __future__ import annotations

import json
from pathlib import Path

from m2flow.schedule import Plan


class Trace:
    def __init__(self, plan: Plan):
        self.plan = plan
        self.events: list[dict] = []
        self._pid = {d.name: i + 1 for i, d in enumerate(plan.cluster.devices)}
        self._tid: dict[str, int] = {}
        self._named: set[tuple[int, int]] = set()
        self._pid["controller"] = 0

    def task(self, row: str, device: str, event: tuple, **args) -> None:
        """`event` is (name, phase, start_s, end_s, step, stage, items, bytes) as recorded by a host."""
        name, phase, start, end, step, stage, items, sent = event
        pid, tid = self._pid.get(device, 0), self._tid.setdefault(row, len(self._tid) + 1)
        if (pid, tid) not in self._named:
            self._named.add((pid, tid))
            self.events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": row}})
        extra = {"step": step, "stage": stage} if step >= 0 else {}
        self.events.append(
            {
                "name": name,
                "cat": phase,
                "ph": "X",
                "pid": pid,
                "tid": tid,
                "ts": start * 1e6,
                "dur": max(0.0, end - start) * 1e6,
                "args": {"worker": row, "device": device, "items": items, "bytes": sent, **extra, **args},
            }
        )

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
