"""The plan: placement, pipeline stages, the per-iteration phase program, and the predicted micro schedule.

A plan is data. The planner writes it, the dry run draws it, the executor runs it, and it is saved
beside every run (`plan.json`) so a run can be diffed against its prediction.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, NamedTuple

from m2flow.cluster import Cluster, DeviceId
from m2flow.spec import Edge


class ReplicaId(NamedTuple):
    worker: str
    replica: int

    def __str__(self) -> str:
        return f"{self.worker}[{self.replica}]"


def execution_id(placements: dict[str, Placement], stages: int, processes: Sequence[Sequence[ReplicaId]]) -> str:
    """How a plan runs, whatever its mode is called — its stages, each replica's device, the replicas sharing a
    process — as the cost cache keys what a run of it measured of its loop's messages: `S=2 3f9a0c1d2b4e`, the
    stages and a digest of the rest."""
    replicas = sorted(
        f"{ReplicaId(name, r)}@{d}" for name, p in placements.items() for r, d in enumerate(p.replica_devices)
    )
    together = sorted("+".join(sorted(str(replica) for replica in group)) for group in processes)
    layout = " ".join(replicas) + " | " + " ".join(together)
    return f"S={stages} {hashlib.sha256(layout.encode()).hexdigest()[:12]}"


@dataclass
class Placement:
    """Where one worker runs: the devices it may use, and the device of each replica."""

    worker: str
    devices: list[DeviceId]
    replica_devices: list[DeviceId]

    @property
    def device_kind(self) -> str:
        return self.devices[0].kind

    def to_dict(self) -> dict[str, Any]:
        return {
            "worker": self.worker,
            "devices": [d.name for d in self.devices],
            "replica_devices": [d.name for d in self.replica_devices],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Placement:
        return cls(
            data["worker"],
            [DeviceId.parse(d) for d in data["devices"]],
            [DeviceId.parse(d) for d in data["replica_devices"]],
        )


@dataclass
class Task:
    """One predicted micro task: a port call on a device, with its dependencies."""

    id: int
    worker: str
    replica: int
    port: str
    device: DeviceId
    start: float
    end: float
    phase: str
    step: int = -1
    stage: int = 0
    deps: list[int] = field(default_factory=list)
    # the device seconds it takes; its span, start to end, is longer on a CPU core it shares with other
    # processes' tasks (`planners/timeshare.py`)
    work_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "device": self.device.name}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Task:
        return cls(**{**data, "device": DeviceId.parse(data["device"])})


@dataclass
class Phase:
    """One step of the per-iteration program the controller runs: its `op` (`sync`, `loop`, `then`) and
    the edges it moves data over.

    `offload` / `onload` name the workers swapped out of / into device memory just before it; a phase
    skipped this iteration (sync every k) skips its swaps too. `streamed`: the then-edges whose parts go
    to their destination as each loop replica finishes, before the loop phase ends. `overlaps`: the phase
    runs beside the loop that follows it (the then-phase of an asynchronous flow, on an earlier batch).
    """

    op: str
    edges: list[Edge] = field(default_factory=list)
    every: int = 1
    offload: list[str] = field(default_factory=list)
    onload: list[str] = field(default_factory=list)
    streamed: list[Edge] = field(default_factory=list)
    overlaps: bool = False

    @property
    def workers(self) -> set[str]:
        """The workers this phase calls."""
        return {ref.worker for edge in self.edges for ref in (edge.src, edge.dst)}

    def runs_at(self, iteration: int) -> bool:
        return iteration % self.every == 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "edges": [str(e) for e in self.edges],
            "every": self.every,
            "offload": self.offload,
            "onload": self.onload,
            "streamed": [str(e) for e in self.streamed],
            "overlaps": self.overlaps,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Phase:
        edges = {key: [Edge.model_validate(e) for e in data.get(key, [])] for key in ("edges", "streamed")}
        return cls(
            data["op"],
            edges["edges"],
            data["every"],
            data["offload"],
            data["onload"],
            edges["streamed"],
            data.get("overlaps", False),
        )


DEFAULT_SOURCE = "default"  # a port's cost or a worker's memory that nobody declared, measured or estimated
HANDOFF_SOURCE = "assumed (hands data on)"  # a port that hands data on, costed as such: nobody measured it


def guessed(source: str) -> bool:
    """Whether a port's cost from this source is a guess (a default by worker kind, or a handoff's)."""
    return source in (DEFAULT_SOURCE, HANDOFF_SOURCE)


# in a port's key, its cost beside rendering on its GPU (`planners/render.py`); in a cost's source, a cost measured only
# beside rendering, standing for the port's cost where it does not run so
BESIDE_RENDERING = " beside rendering"


def stands_in(source: str) -> bool:
    """Whether a port's cost from `source` was measured only beside rendering, standing for its cost alone."""
    return BESIDE_RENDERING in source


def unknown_costs(sources: dict[str, str]) -> list[str]:
    """Of `worker.port` -> where its cost came from, the ports whose cost is a default, or stands in for one no run
    measured (a cost measured only beside rendering: a run measures it); no memory estimates."""
    return sorted(k for k, s in sources.items() if (s == DEFAULT_SOURCE or stands_in(s)) and not k.endswith(".memory"))


@dataclass
class Prediction:
    """What the event simulator predicts for one steady-state iteration of a plan."""

    iteration_s: float
    phase_s: dict[str, float]
    env_steps_per_iteration: int
    device_busy: dict[DeviceId, float]
    bubble_fraction: float
    simulated_steps: int
    port_s: dict[str, float] = field(default_factory=dict)
    loop_step_s: float = 0.0
    cost_sources: dict[str, str] = field(default_factory=dict)
    hidden_s: float = 0.0  # of the phases' seconds, those hidden behind the loop (asynchronous flows)
    trains_one_in: int = 1  # flow.async with on_stale: drop: loops per training (the other batches dropped)

    @property
    def env_steps_per_s(self) -> float:
        return self.env_steps_per_iteration / self.iteration_s if self.iteration_s > 0 else 0.0

    @property
    def unknown_costs(self) -> list[str]:
        """Ports whose cost nobody declared or measured: the prediction used a default for them."""
        return unknown_costs(self.cost_sources)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["device_busy"] = {d.name: busy for d, busy in self.device_busy.items()}
        return {**out, "env_steps_per_s": self.env_steps_per_s}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Prediction:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["device_busy"] = {DeviceId.parse(d): busy for d, busy in data["device_busy"].items()}
        return cls(**values)


@dataclass
class Candidate:
    """One row of the planner's ranking: a mode, its stage count, and what it is predicted to give."""

    mode: str
    stages: int | None
    iteration_s: float | None
    env_steps_per_s: float | None
    bubble_fraction: float | None
    feasible: bool = True
    reason: str = ""
    layout: str = "-"
    floor_s: float | None = None  # a layout left unsimulated: the iteration no plan of it goes under

    @classmethod
    def of(cls, mode: str, stages: int, prediction: Prediction) -> Candidate:
        return cls(mode, stages, prediction.iteration_s, prediction.env_steps_per_s, prediction.bubble_fraction, True)

    @classmethod
    def infeasible(cls, mode: str, reason: str, layout: str = "-") -> Candidate:
        return cls(mode, None, None, None, None, False, reason, layout)

    @classmethod
    def skipped(cls, layout: str, floor_s: float, best_s: float) -> Candidate:
        """A layout the allocation search did not simulate: its floor is above the best plan found by then."""
        reason = f"not simulated: no plan of it is under {floor_s:.4g} s/iteration, the best found was {best_s:.4g} s"
        return cls("-", None, None, None, None, False, reason, layout, floor_s)


class MicroSchedule(Sequence):
    """A plan's tasks, written out when first read: a search weighs many plans and keeps one, and only its
    micro schedule is wanted in full (the copies of symmetric components are written out then)."""

    def __init__(self, write: Callable[[], list[Task]]):
        self._write: Callable[[], list[Task]] | None = write
        self._tasks: list[Task] = []

    def _written(self) -> list[Task]:
        if self._write is not None:
            self._tasks, self._write = self._write(), None
        return self._tasks

    def __getitem__(self, index: int | slice) -> Task | list[Task]:
        return self._written()[index]

    def __len__(self) -> int:
        return len(self._written())

    def __iter__(self) -> Iterator[Task]:
        return iter(self._written())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, (list, MicroSchedule)) and self._written() == list(other)

    def __repr__(self) -> str:
        return f"MicroSchedule({len(self)} tasks)"

    def __reduce__(self):
        return (list, (self._written(),))  # the tasks, not the simulation that writes them


@dataclass
class Plan:
    workflow: str
    mode: str
    cluster: Cluster
    placements: dict[str, Placement]
    pipeline_stages: int
    phases: list[Phase]
    predicted: Prediction
    tasks: Sequence[Task] = field(default_factory=list)  # a MicroSchedule where a planner wrote it
    candidates: list[Candidate] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    spec_overrides: list[str] = field(default_factory=list)  # knobs the planner set, as `key=value`
    processes: list[list[ReplicaId]] = field(default_factory=list)  # replicas sharing a process
    transports: dict[str, str] = field(default_factory=dict)  # each sync edge's (m2flow.transfer)
    memory_shares: dict[ReplicaId, float] = field(default_factory=dict)  # of a shared GPU, per replica's process
    merge_slices: list[str] = field(default_factory=list)  # loop ports taking in later slices (planners/merging.py)

    @property
    def layout_key(self) -> tuple:
        """What a switch to another plan would change: the mode, the stages, where replicas run and which share a
        process."""
        return self.mode, self.pipeline_stages, self.placements, self.processes

    @property
    def execution(self) -> str:
        """How the plan runs, as the cost cache keys it (`execution_id`)."""
        return execution_id(self.placements, self.pipeline_stages, self.processes)

    @property
    def label(self) -> str:
        """How a note or a table names the plan: its mode, stages and whether replicas share processes."""
        return f"{self.mode} S={self.pipeline_stages}" + (" co-hosted" if self.processes else "")

    def occupants(self) -> Counter[DeviceId]:
        """How many replicas (of any worker) each device hosts."""
        return Counter(d for p in self.placements.values() for d in p.replica_devices)

    def device_of(self, replica: ReplicaId) -> DeviceId:
        return self.placements[replica.worker].replica_devices[replica.replica]

    def memory_gb(self, replica: ReplicaId) -> float | None:
        """The GPU memory the process of `replica` may hold, where its GPU is shared (`memory_shares`)."""
        share = self.memory_shares.get(replica)
        return None if share is None else share * self.cluster.memory_gb[self.device_of(replica)]

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
            "placements": {k: v.to_dict() for k, v in self.placements.items()},
            "pipeline_stages": self.pipeline_stages,
            "phases": [p.to_dict() for p in self.phases],
            "predicted": self.predicted.to_dict(),
            "tasks": [t.to_dict() for t in self.tasks],
            "candidates": [asdict(c) for c in self.candidates],
            "notes": self.notes,
            "spec_overrides": self.spec_overrides,
            "processes": [[list(m) for m in group] for group in self.processes],
            "transports": self.transports,
            "memory_shares": [[r.worker, r.replica, share] for r, share in self.memory_shares.items()],
            "merge_slices": self.merge_slices,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        return cls(
            workflow=data["workflow"],
            mode=data["mode"],
            cluster=Cluster.from_dict(data["cluster"]),
            placements={k: Placement.from_dict(v) for k, v in data["placements"].items()},
            pipeline_stages=data["pipeline_stages"],
            phases=[Phase.from_dict(p) for p in data["phases"]],
            predicted=Prediction.from_dict(data["predicted"]),
            tasks=[Task.from_dict(t) for t in data["tasks"]],
            candidates=[Candidate(**c) for c in data["candidates"]],
            notes=data["notes"],
            spec_overrides=data.get("spec_overrides", []),
            processes=[[ReplicaId(w, int(r)) for w, r in group] for group in data.get("processes", [])],
            transports=data.get("transports", {}),
            memory_shares={ReplicaId(w, int(r)): share for w, r, share in data.get("memory_shares", [])},
            merge_slices=data.get("merge_slices", []),
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
