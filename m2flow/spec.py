"""The workflow declaration: pydantic models shared by the Python API and YAML files.

YAML is only a serialisation of `WorkflowSpec`; `dump_spec` and `load_spec` round-trip losslessly.
Cross-references (which worker, which port) are checked by `m2flow.graph`, not here.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_serializer, model_validator

from m2flow.strict_numbers import NumbersNotBooleans

WorkerKind = Literal["simulator", "inference", "training", "buffer", "function"]
PlacementMode = Literal["auto", "shared", "disaggregated", "hybrid"]

MAX_THREADS = 1024  # cores of one node a replica may compute on
MAX_REPLICAS = 100_000


def device_list(text: str | int | list[int]) -> list[int] | None:
    """A hand layout's devices as RLinf users write them — `3`, `0-3`, `0,2,5`, `0-1,4` or a list — as indices
    (None: `all`); a ValueError saying what is wrong with how it is written (which exist, the planner checks)."""
    if isinstance(text, int):
        return [text]
    if isinstance(text, list):
        return list(text)
    if text.strip() == "all":
        return None
    wanted: list[int] = []
    for part in text.split(","):
        first, sep, last = part.strip().partition("-")
        try:
            wanted += list(range(int(first), int(last) + 1)) if sep else [int(first)]
        except ValueError:
            raise ValueError(f"'{text}' is not a device list like 0-3, 0,2,5 or all") from None
        if sep and int(last) < int(first):
            raise ValueError(f"the range '{part.strip()}' runs backwards; write {last}-{first}")
    return wanted


_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_\-]*$")
_WORKER_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PORT_REF = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)\s*$")


class _Strict(NumbersNotBooleans):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, validate_default=True)


class _Written(_Strict):
    """A value the workflow writes as one string (`env.step`, `env.obs -> policy.act`) and the code reads
    as typed fields: parsed from that string, written back as it, hashable."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def fields_of(cls, text: str) -> dict[str, Any]:
        """The fields written in `text`, or ValueError saying what form is expected."""
        raise NotImplementedError

    @model_validator(mode="before")
    @classmethod
    def _parse(cls, value: Any) -> Any:
        return cls.fields_of(value) if isinstance(value, str) else value

    @model_serializer
    def _dump(self) -> str:
        return str(self)


class PortRef(_Written):
    """`worker.port`: a method of a worker (a function worker has the single port `call`)."""

    worker: str
    port: str

    @classmethod
    def fields_of(cls, text: str) -> dict[str, Any]:
        match = _PORT_REF.match(text)
        if not match:
            raise ValueError(f"'{text}' is not of the form worker.port (e.g. env.step)")
        return {"worker": match.group(1), "port": match.group(2)}

    def __str__(self) -> str:
        return f"{self.worker}.{self.port}"


class Edge(_Written):
    """`src.port -> dst.port`: the output of `src.port` is the input of `dst.port`."""

    src: PortRef
    dst: PortRef

    @classmethod
    def fields_of(cls, text: str) -> dict[str, Any]:
        parts = text.split("->")
        if len(parts) != 2:
            raise ValueError(f"'{text}' is not an edge of the form 'src.port -> dst.port'")
        return {"src": parts[0], "dst": parts[1]}

    def __str__(self) -> str:
        return f"{self.src} -> {self.dst}"


class PortCost(_Strict):
    """Declared cost of one call of a port: `fixed_s + per_item_s * batch_items`."""

    fixed_s: float = Field(0.0, ge=0)
    per_item_s: float = Field(0.0, ge=0)


class Dispatch(_Strict):
    """How a call of a port is split over the worker's replicas and whose outputs stand for the group.

    `split`: `broadcast` (every replica receives every input shard), `shard` (each data-parallel rank
    receives its contiguous block of the input shards; ranks of one model-parallel group receive the same) or,
    for a port a sync edge copies a state to, `first` (only the first replica receives it: a state one replica
    reads, such as the weights a simulator's first replica evaluates; the others are not sent it).
    `gather`: `all` (every replica's output, in replica order) or `rank_zero` (the group's output is rank
    0's; the other ranks took part in its collectives).
    `even` (with `shard`): every rank must receive as many input shards as every other (a replay buffer's shards
    hold equal env steps); a workflow whose counts cannot split so is refused as it is validated.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    split: Literal["broadcast", "shard", "first"] = "broadcast"
    gather: Literal["all", "rank_zero"] = "all"
    even: bool = False

    @model_validator(mode="after")
    def _even_shards(self) -> Dispatch:
        if self.even and self.split != "shard":
            raise ValueError("even: only a `shard` split gives each rank its own input shards to count")
        return self


class Resources(_Strict):
    """What one replica needs. `device: auto` puts inference/training on GPUs when there are any."""

    device: Literal["auto", "cpu", "gpu"] = "auto"
    memory_gb: float = Field(0.0, ge=0)
    threads: int | Literal["auto"] = Field(
        1,
        description="cores each CPU replica computes on (torch intra-op threads), a block of its node's; only"
        " outside the loop of a synchronous flow, where no other worker computes beside it. `auto`: its node's"
        " cores shared among its replicas there, where it may (else 1)",
    )

    @field_validator("threads", mode="before")
    @classmethod
    def _threads(cls, value: Any) -> Any:
        if value == "auto":
            return value
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_THREADS:
            raise ValueError(f"a count of cores from 1 to {MAX_THREADS:,}, or `auto` (its node's, shared)")
        return value


class ReplicaRange(_Strict):
    """`replicas: {min, max}`: the planner chooses how many, within these bounds."""

    min: int = Field(1, ge=1, le=MAX_REPLICAS)
    max: int | None = Field(None, ge=1, le=MAX_REPLICAS)

    @model_validator(mode="after")
    def _ordered(self) -> ReplicaRange:
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max}) is below min ({self.min})")
        return self


class WorkerSpec(_Strict):
    kind: WorkerKind = "function"
    cls: str = Field(alias="class", description="dotted path to the worker class or function")
    replicas: int | Literal["auto"] | ReplicaRange = Field(
        1, description="how many Ray actors (ranks); `auto` or {min, max}: the planner chooses"
    )
    args: dict[str, Any] = Field(default_factory=dict)
    backend: str | None = None
    resources: Resources = Field(default_factory=Resources)
    profile: dict[str, PortCost] = Field(default_factory=dict)
    dispatch: dict[str, Dispatch] = Field(
        default_factory=dict, description="per port: how calls are split and gathered (default: by kind)"
    )

    @field_validator("replicas", mode="before")
    @classmethod
    def _replicas(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return ReplicaRange.model_validate(value)  # its own errors, not every branch of the union's
        if value == "auto":
            return value
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_REPLICAS:
            raise ValueError(f"a count from 1 to {MAX_REPLICAS:,}, `auto`, or {{min, max}} (the planner chooses)")
        return value

    @property
    def count(self) -> int:
        """The replica count to plan with: the declared one, or the least the planner may choose."""
        if isinstance(self.replicas, int):
            return self.replicas
        return 1 if self.replicas == "auto" else self.replicas.min

    @property
    def scaling(self) -> ReplicaRange | None:
        """The range the planner chooses the replica count in (None: the count is declared)."""
        if isinstance(self.replicas, int):
            return None
        return ReplicaRange() if self.replicas == "auto" else self.replicas

    @field_validator("cls")
    @classmethod
    def _dotted(cls, value: str) -> str:
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_.]*[.:][A-Za-z_][A-Za-z0-9_.]*$", value):
            raise ValueError(f"'{value}' is not a dotted path like package.module.ClassName")
        return value

    @model_validator(mode="after")
    def _backend_only_for_training(self) -> WorkerSpec:
        if self.backend is not None and self.kind != "training":
            raise ValueError(f"'backend' applies to training workers only, this worker is '{self.kind}'")
        return self


class LoopSpec(_Strict):
    """Edges repeated `horizon` times per iteration; they must chain into a cycle or a path."""

    horizon: int = Field(1, ge=1, le=10_000_000)
    edges: list[Edge] = Field(min_length=1)


TransportRequest = Literal["auto", "object_store", "collective", "cuda_ipc"]  # see m2flow.transfer


class SyncSpec(_Strict):
    edge: Edge
    every: int = Field(1, ge=1)
    transport: TransportRequest = Field(
        "auto", description="how the state travels: auto, object_store, collective (NCCL/gloo) or cuda_ipc"
    )


class AsyncSpec(_Strict):
    """Training overlaps the loop: while the after-loop edges train on batch i, the loop already collects
    batch i + `max_staleness` with the weights of the moment (one-step-off for 1).

    `on_stale` says how the bound holds when training is slower than the loop. `block`: the loop waits for
    training, so every batch trains exactly `max_staleness` policy versions after the one that collected
    it (fewer right after a checkpoint, where the loop waits for training to catch up); 0 is the
    synchronous flow. `drop`: the loop never waits; training takes the oldest queued batch within the
    bound whenever it is free and a batch older than that is dropped (its env steps are counted as
    dropped), so each iteration is one loop and trains a batch only when training has finished the last."""

    max_staleness: int = Field(1, ge=0, le=64, description="policy versions a batch may lag the one trained")
    on_stale: Literal["block", "drop"] = Field(
        "block", description="block: the loop waits for training; drop: it never waits, stale batches are dropped"
    )


class FlowSpec(_Strict):
    loop: LoopSpec | None = None
    then: list[Edge] = Field(default_factory=list)
    sync: list[SyncSpec] = Field(default_factory=list)
    asynchronous: AsyncSpec | None = Field(
        None, alias="async", description="overlap training with the next loops (off-policy by max_staleness)"
    )


class PlacementSpec(_Strict):
    mode: PlacementMode = "auto"
    pipeline_stages: int | Literal["auto"] = 1
    pin_cpus: bool = Field(True, description="pin CPU-placed replicas to their core, as the plan assumes")
    offload: Literal["auto", "always", "never"] = Field(
        "auto", description="swap workers sharing a device out between their phases (auto: when memory needs it)"
    )
    profile: str | None = Field(
        None, description="measured costs (m2flow profile); default <output_dir>/profiles/<name>.json if it exists"
    )
    replan: bool | Literal["auto"] = Field(
        "auto",
        description="after the first iterations, refit costs from the trace and re-plan (auto: when a cost is unknown);"
        " under flow.async those iterations run synchronously",
    )
    search_processes: bool = Field(
        False, description="auto: also choose how many simulator processes share the loop's envs (total kept)"
    )
    colocate: bool | Literal["auto"] = Field(
        "auto",
        description="loop workers' replicas on the same device share one process (per-step data is a direct call);"
        " auto: where that is predicted at least 5% faster",
    )
    merge_slices: bool | Literal["auto"] = Field(
        "auto",
        description="a batch-invariant loop port (a policy's act) takes into one call the later pipeline slices"
        " that arrived while it worked; auto: where its cost is mostly per call (planners/merging.py)",
    )
    memory_shares: bool = Field(
        True,
        description="cap each process on a GPU that several share at its share of the memory: the GPU's usable"
        " memory less what the others' estimates need",
    )
    devices: dict[str, str | int | list[int]] | None = Field(
        None, description="pin workers by hand, e.g. {env: 0-3, rollout: 4-7, actor: all}; indices per device kind"
    )

    @field_validator("devices")
    @classmethod
    def _device_lists(cls, value: dict[str, str | int | list[int]] | None) -> dict[str, str | int | list[int]] | None:
        wrong = []
        for worker, text in (value or {}).items():
            try:
                device_list(text)
            except ValueError as exc:
                wrong.append(f"{worker}: {exc}")
        if wrong:
            raise ValueError("; ".join(wrong))
        return value

    @field_validator("pipeline_stages")
    @classmethod
    def _positive(cls, value: int | str) -> int | str:
        if isinstance(value, int) and not 1 <= value <= 1024:
            raise ValueError("pipeline_stages must be between 1 and 1024, or 'auto'")
        return value


class ClusterSpec(_Strict):
    """The devices to plan for. Unset counts mean 'this machine' (or the joined Ray cluster)."""

    gpus: int | None = Field(None, ge=0, le=1_000_000)
    cpus: int | None = Field(None, ge=1, le=10_000_000)
    nodes: int = Field(1, ge=1, le=100_000)
    gpu_memory_gb: float | None = Field(None, gt=0, description="unset: this machine's GPUs' (nvidia-smi), else 80")
    cpu_memory_gb: float | None = Field(None, gt=0)
    address: str | None = Field(None, description="Ray cluster to join, e.g. 'auto' or 'host:6379'")


class TimeoutSpec(_Strict):
    """Deadlines, in seconds, for every wait. Unset call/channel deadlines come from the plan: the
    predicted time of what is awaited times `safety_factor`, kept between `floor_s` and `ceiling_s`."""

    start_s: float = Field(180.0, gt=0, description="worker start-up (imports, model build)")
    call_s: float | None = Field(None, gt=0, description="one coarse phase call; unset: from the plan")
    channel_s: float | None = Field(None, gt=0, description="one receive on a channel; unset: from the plan")
    silence_s: float = Field(
        5.0,
        ge=2.0,
        description="a worker process that gives no sign of life for this long (no beat: a thread of its own beats) is"
        " hung: stopped, or stuck in native code that holds the GIL; in the loop at most the channel deadline",
    )
    safety_factor: float = Field(20.0, ge=1)
    floor_s: float = Field(60.0, gt=0)
    ceiling_s: float = Field(3600.0, gt=0)

    @model_validator(mode="after")
    def _floor_under_ceiling(self) -> TimeoutSpec:
        if self.floor_s > self.ceiling_s:
            raise ValueError(
                f"floor_s ({self.floor_s:g}) is above ceiling_s ({self.ceiling_s:g}); lower one or raise the other"
            )
        return self


class RunSpec(_Strict):
    iterations: int = Field(10, ge=1, le=10_000_000)
    seed: int = Field(0, ge=0, lt=2**32, description="numpy, torch and gymnasium seeds")
    output_dir: str = "runs"
    checkpoint_every: int = Field(10, ge=0, description="0 saves only at the end")
    resume: bool = False
    progress: bool = True
    trace_detail_iterations: int = Field(2, ge=0, description="iterations traced per micro task")
    timeouts: TimeoutSpec = Field(default_factory=TimeoutSpec)
    on_failure: Literal["stop", "restart", "replace"] = Field(
        "stop",
        description="restart: recreate the workers, restore the last checkpoint, continue; replace: a simulator"
        " or inference replica that dies or hangs (in the loop, between loops, in the weight sync) is replaced in"
        " place and only the unfinished part of the loop is redone, a training worker whose rank fails while it"
        " trains restarts alone from a checkpoint written right before the iteration (any other failure restarts)",
    )
    max_restarts: int = Field(3, ge=0, description="restarts allowed before the run stops with its failure history")
    max_replacements: int = Field(
        20, ge=0, description="on_failure: replace: processes replaced in place per run (a training worker: one)"
    )
    quarantine_after: int = Field(
        2,
        ge=1,
        description="on_failure: replace: an env failing this many times (it raised m2flow.EnvFailed, or"
        " the process crashed inside WorkerContext.working_on(env)) is quarantined: started again from a new"
        " seed and reported",
    )
    replacement_state: Literal["reset", "checkpoint"] = Field(
        "reset",
        description="a replaced simulator replica's envs start new episodes (reset; its load_statistics hook still"
        " gets its state in the last checkpoint: observation statistics) or resume from that state (checkpoint)",
    )
    spares: bool = Field(
        True,
        description="on_failure: replace: spare processes (started, their imports done at the lowest priority) for"
        " the replicas on CPU cores that may be replaced, one per worker and node (per rank for a training worker),"
        " so a replacement skips the process start; the memory of an idle process each",
    )


class WorkflowSpec(_Strict):
    name: str
    workers: dict[str, WorkerSpec] = Field(min_length=1)
    flow: FlowSpec = Field(default_factory=FlowSpec)
    placement: PlacementSpec = Field(default_factory=PlacementSpec)
    cluster: ClusterSpec = Field(default_factory=ClusterSpec)
    run: RunSpec = Field(default_factory=RunSpec)

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"'{value}' must start with a letter and hold only letters, digits, '_' or '-'")
        return value

    @field_validator("workers")
    @classmethod
    def _worker_names(cls, value: dict[str, WorkerSpec]) -> dict[str, WorkerSpec]:
        for name in value:
            if not _WORKER_NAME.match(name):
                raise ValueError(f"worker name '{name}' must be an identifier: letters, digits and '_'")
        return value

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)
