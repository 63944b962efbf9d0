"""How much of a shared GPU's memory each process may hold: its usable memory less what the processes resident
beside it are estimated to need. Processes that share a GPU (inference beside training, several inference
replicas) then cannot take what the plan keeps for the others: one that outgrows its estimate runs out of
memory itself, named, instead of a neighbour failing. Each process caps its CUDA caching allocator at its
share (`m2flow.runtime.gpu_memory`); EGL renderers allocate outside it."""

from __future__ import annotations

from m2flow.cluster import Cluster, DeviceId
from m2flow.planners.offload import resident_sets
from m2flow.planners.processes import Processes
from m2flow.planners.profile import Profile
from m2flow.schedule import Phase, Placement, Plan, ReplicaId

USABLE = 0.9  # of a GPU's memory, for the processes' allocators: the rest for CUDA contexts, EGL, fragmentation


def memory_shares(
    placements: dict[str, Placement],
    phases: list[Phase],
    offloaded: set[str],
    processes: Processes,
    cluster: Cluster,
    profile: Profile,
) -> tuple[dict[ReplicaId, float], list[str]]:
    """Per replica on a GPU that several processes share: the fraction of that GPU's memory its process may
    hold (replicas hosted in one process carry the process's total). A GPU where a worker has no memory
    estimate gets no shares, and a note says which worker to give one."""
    process_of = {member: tuple(group) for group in processes for member in group}
    on_device: dict[DeviceId, dict[tuple[ReplicaId, ...], list[ReplicaId]]] = {}
    for name, placement in placements.items():
        for index, device in enumerate(placement.replica_devices):
            if device.kind == "gpu":
                replica = ReplicaId(name, index)
                on_device.setdefault(device, {}).setdefault(process_of.get(replica, (replica,)), []).append(replica)
    resident = resident_sets(placements, phases, offloaded)
    shares: dict[ReplicaId, float] = {}
    notes = []
    for device, by_process in sorted(on_device.items()):
        if len(by_process) < 2:
            continue
        unknown = sorted({r.worker for members in by_process.values() for r in members} - _estimated(profile))
        if unknown:
            notes.append(
                f"no memory shares on {device.name}: {', '.join(f'workers.{w}' for w in unknown)}"
                f" {'has' if len(unknown) == 1 else 'have'} no memory estimate (declare resources.memory_gb to let"
                " its processes share the GPU's memory by plan)"
            )
            continue
        capacity = cluster.memory_gb[device]
        for process, members in by_process.items():
            own = sum(profile.memory_gb[r.worker] for r in members)
            beside = max(
                (
                    sum(
                        profile.memory_gb[r.worker]
                        for p, m in by_process.items()
                        if p != process
                        for r in m
                        if r.worker in workers
                    )
                    for workers in resident
                    if any(r.worker in workers for r in members)
                ),
                default=0.0,
            )
            share = max(USABLE - beside / capacity, own / capacity)
            if own + beside > USABLE * capacity:
                notes.append(
                    f"memory shares on {device.name}: {' + '.join(map(str, members))} is capped at its own estimate"
                    f" ({own:g} GB): with the others' it fills more than {USABLE:.0%} of the GPU, so no room is left"
                    " to grow into"
                )
            shares.update({r: share for r in members})
    return shares, notes


def share_notes(plan: Plan) -> list[str]:
    """One line per GPU with shares: each process's share, as the plan explains itself."""
    by_device: dict[DeviceId, dict[float, list[ReplicaId]]] = {}
    for replica, share in plan.memory_shares.items():
        by_device.setdefault(plan.device_of(replica), {}).setdefault(share, []).append(replica)
    notes = []
    for device, by_share in sorted(by_device.items()):
        capacity = plan.cluster.memory_gb[device]
        parts = ", ".join(
            f"{' + '.join(map(str, members))} {share:.0%} ({share * capacity:.3g} GB)"
            for share, members in by_share.items()
        )
        notes.append(
            f"memory shares on {device.name} ({capacity:g} GB): {parts} (each process's CUDA allocator capped at"
            " what the others' estimates leave)"
        )
    return notes


def _estimated(profile: Profile) -> set[str]:
    return {name for name, gb in profile.memory_gb.items() if gb > 0}
