"""How a sync edge's state travels from its source to every destination replica that receives it (its port's
dispatch: `first` sends it to the first alone), chosen from the plan.

- `object_store`: through Ray's object store and host memory (works everywhere; a host round trip).
- `collective`: one broadcast in a process group of the source's first rank and every destination
  replica (NCCL between GPUs, one rank per GPU; gloo between CPU slots), device to device.
- `cuda_ipc`: every destination shares the source's GPU: it maps the source's buffers (CUDA IPC
  handles) and copies device to device, no host round trip.

`auto` takes the fastest one the devices allow. Pure: the planner and the dry run can name it too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal

from m2flow.cluster import DeviceId
from m2flow.dispatch import state_receivers
from m2flow.errors import PlanError
from m2flow.schedule import Plan, ReplicaId
from m2flow.spec import TransportRequest

if TYPE_CHECKING:
    from m2flow.graph import MacroGraph

Transport = Literal["object_store", "collective", "cuda_ipc"]


def _on_source_gpu(source: DeviceId, targets: Sequence[DeviceId]) -> str | None:
    if source.kind != "gpu" or any(t != source for t in targets):
        return f"needs every destination replica on the source's GPU {source}"
    return None


def _one_rank_per_device(source: DeviceId, targets: Sequence[DeviceId]) -> str | None:
    devices = [source, *targets]
    if len({d.kind for d in devices}) > 1:
        return "needs the source and every destination on one device kind (all GPUs or all CPU slots)"
    if source.kind == "gpu" and len(set(devices)) < len(devices):
        return "needs one GPU per member of the group (NCCL runs one rank per GPU)"
    return None


# what each transport needs of the devices: None when they allow it, else why not
NEEDS: dict[Transport, Callable[[DeviceId, Sequence[DeviceId]], str | None]] = {
    "object_store": lambda source, targets: None,
    "collective": _one_rank_per_device,
    "cuda_ipc": _on_source_gpu,
}
# `auto`'s preference: first the one without a copy through the host, then the group, then the store
PREFERENCE: tuple[Transport, ...] = ("cuda_ipc", "collective", "object_store")


def choose_transport(
    requested: TransportRequest, source: DeviceId, targets: Sequence[DeviceId], *, same_process: bool, where: str
) -> Transport:
    """The transport of one sync edge: the one requested if the devices allow it, else the first of
    `PREFERENCE` they allow. Replicas hosted in the source's process (`placement.colocate`) use the
    object store: a group or an IPC mapping needs two processes."""

    def why_not(transport: Transport) -> str | None:
        if same_process and transport != "object_store":
            return "needs the source and its destinations in separate processes"
        return NEEDS[transport](source, targets)

    if requested == "auto":
        return next(t for t in PREFERENCE if why_not(t) is None)
    why = why_not(requested)
    if why:
        on = ", ".join(str(t) for t in targets)
        raise PlanError(
            f"{where}.transport: {requested} {why}; the source is on {source}, the destinations on {on}."
            " Use transport: auto (picks what the placement allows) or object_store"
        )
    return requested


def sync_transports(graph: MacroGraph, plan: Plan) -> dict[str, Transport]:
    """Each sync edge's transport (by the edge as written), from where the plan put the source's first
    replica (it sends for the group) and every destination replica that receives the state."""
    chosen = {}
    for i, sync in enumerate(graph.sync):
        src, dst = sync.edge.src, sync.edge.dst
        first = ReplicaId(src.worker, 0)
        planned = len(plan.placements[dst.worker].replica_devices)  # the plan's count (`replicas: auto` sets it)
        receivers = state_receivers(graph.info[dst.worker].dispatch(dst.port), planned)
        targets = [ReplicaId(dst.worker, r) for r in receivers]
        # a worker syncing itself, or replicas co-hosted with the sender: one process cannot meet itself
        same_process = src.worker == dst.worker or any(
            first in group and any(t in group for t in targets) for group in plan.processes
        )
        chosen[str(sync.edge)] = choose_transport(
            sync.transport,
            plan.device_of(first),
            [plan.device_of(t) for t in targets],
            same_process=same_process,
            where=f"flow.sync[{i}]",
        )
    return chosen


def mapping_kept(plan: Plan, src_worker: str) -> bool:
    """Whether a sync's destinations keep the source's buckets mapped from sync to sync (`cuda_ipc`): not where
    the plan swaps the source out of device memory, since a mapping would hold its buckets there while it is
    out (a destination swapped out drops its own mapping)."""
    return not any(src_worker in phase.offload for phase in plan.phases)
