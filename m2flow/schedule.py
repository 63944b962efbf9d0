"""The plan: placement, pipeline stages, the per-iteration phase program, and the predicted micro schedule.

A plan is data. The planner writes it, the dry run draws it, the executor runs it, and it is saved
beside every run (`plan.json`) so a run can be diffed against its prediction.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from m2flow.cluster import Cluster


@dataclass
class Placement:
    """Where one worker runs: the devices it may use, and the device of each replica."""

    worker: str
    device_kind: str
    devices: list[int]
    replica_devices: list[int]


@dataclass
class Task:
    """One predicted micro task: a port call on a device, with its dependencies."""

    id: int
    worker: str
    replica: int
    port: str
    device: str
    start: float
    end: float
    phase: str
    step: int = -1
    stage: int = 0
    deps: list[int] = field(default_factory=list)


@dataclass
class Phase:
    """One step of the per-iteration program the controller runs: `sync`, `loop` or `then`.

    `offload` / `onload` name the workers swapped out of / into device memory just before it; a phase
    skipped this iteration (sync every k) skips its swaps too. `streamed`: the then-edges whose parts go
    to their destination as each loop replica finishes, before the loop phase ends.
    """

    op: str
    edges: list[str] = field(default_factory=list)
    every: int = 1
    offload: list[str] = field(default_factory=list)
    onload: list[str] = field(default_factory=list)
    streamed: list[str] = field(default_factory=list)


@dataclass
class Plan:
    workflow: str
    mode: str
    cluster: Cluster
    placements: dict[str, Placement]
    pipeline_stages: int
    phases: list[Phase]
    tasks: list[Task] = field(default_factory=list)
    predicted: dict[str, Any] = field(default_factory=dict)
    candidates: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    spec_overrides: list[str] = field(default_factory=list)  # knobs the planner set, as `key=value`
    processes: list[list[tuple[str, int]]] = field(default_factory=list)  # replicas sharing a process

    def device_name(self, index: int) -> str:
        return self.cluster.devices[index].name

    def occupants(self) -> Counter:
        """How many replicas (of any worker) each device hosts."""
        return Counter(d for p in self.placements.values() for d in p.replica_devices)

    def sharing(self) -> list[tuple[str, str]]:
        """Pairs of workers whose device sets overlap (time-multiplexed on the same devices)."""
        names = list(self.placements)
        pairs = []
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                if set(self.placements[a].devices) & set(self.placements[b].devices):
                    pairs.append((a, b))
        return pairs

    def to_dict(self) -> dict[str, Any]:
        return {
            "workflow": self.workflow,
            "mode": self.mode,
            "cluster": self.cluster.to_dict(),
            "placements": {k: asdict(v) for k, v in self.placements.items()},
            "pipeline_stages": self.pipeline_stages,
            "phases": [asdict(p) for p in self.phases],
            "tasks": [asdict(t) for t in self.tasks],
            "predicted": self.predicted,
            "candidates": self.candidates,
            "notes": self.notes,
            "spec_overrides": self.spec_overrides,
            "processes": [[list(m) for m in group] for group in self.processes],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        return cls(
            workflow=data["workflow"],
            mode=data["mode"],
            cluster=Cluster.from_dict(data["cluster"]),
            placements={k: Placement(**v) for k, v in data["placements"].items()},
            pipeline_stages=data["pipeline_stages"],
            phases=[Phase(**p) for p in data["phases"]],
            tasks=[Task(**t) for t in data["tasks"]],
            predicted=data["predicted"],
            candidates=data["candidates"],
            notes=data["notes"],
            spec_overrides=data.get("spec_overrides", []),
            processes=[[(w, int(r)) for w, r in group] for group in data.get("processes", [])],
        )

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1))
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        return cls.from_dict(json.loads(Path(path).read_text()))
