"""Context switches on shared devices: which workers swap out, when, and what memory that saves.

A phase (sync, loop, then) needs some workers. A worker that shares a device with others and is
offloaded is resident only around the phases that need it: the plan attaches `offload`/`onload`
lists to each phase, executed before it. `placement.offload`: `never`; `always` (every worker that
shares a device swaps); `auto` (swap only if the device would not hold everyone at once).
"""

from __future__ import annotations

import dataclasses

from m2flow.cluster import Cluster, DeviceId
from m2flow.graph import MacroGraph
from m2flow.planners.profile import Profile
from m2flow.program import build_phases
from m2flow.schedule import Phase, Placement


class OffloadInfeasible(Exception):
    pass


def sharing_workers(placements: dict[str, Placement]) -> set[str]:
    names = list(placements)
    out = set()
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if set(placements[a].replica_devices) & set(placements[b].replica_devices):
                out |= {a, b}
    return out


def with_swaps(phases: list[Phase], offloaded: set[str]) -> list[Phase]:
    """Attach to each phase the swaps before it, for a steady-state iteration (the program repeats)."""
    if not offloaded:
        return phases
    resident = set(offloaded)
    out = []
    for lap in range(2):  # the second lap starts from the state the first one ends in: the steady state
        for phase in phases:
            need = phase.workers & offloaded
            swap_out, swap_in = sorted((resident & offloaded) - need), sorted(need - resident)
            resident = (resident - set(swap_out)) | set(swap_in)
            if lap == 1:  # a context switch between the loop and the then-phase: nothing streams past it
                streamed = [] if swap_out or swap_in else phase.streamed
                out.append(dataclasses.replace(phase, offload=swap_out, onload=swap_in, streamed=streamed))
    return out


def resident_sets(placements: dict[str, Placement], phases: list[Phase], offloaded: set[str]) -> list[set[str]]:
    """Per phase, the workers resident on their devices: all but the offloaded ones the phase does not use."""
    always = {n for n in placements if n not in offloaded}
    return [always | (phase.workers & offloaded) for phase in phases or [Phase("idle")]]


def peak_memory(
    placements: dict[str, Placement], phases: list[Phase], offloaded: set[str], profile: Profile
) -> dict[DeviceId, tuple[float, list[str]]]:
    """Per device, the most memory resident at once, and who holds it then."""
    peak: dict[DeviceId, tuple[float, list[str]]] = {}
    for resident in resident_sets(placements, phases, offloaded):
        load: dict[DeviceId, list[str]] = {}
        for name in resident:
            for device in placements[name].replica_devices:
                load.setdefault(device, []).append(name)
        for device, names in load.items():
            need = sum(profile.memory_gb.get(n, 0.0) for n in names)
            if need > peak.get(device, (-1.0, []))[0]:
                peak[device] = (need, sorted(names))
    return peak


def choose_offload(graph: MacroGraph, placements: dict[str, Placement], cluster: Cluster, profile: Profile) -> set[str]:
    policy = graph.spec.placement.offload
    phases = build_phases(graph)
    candidates = sharing_workers(placements)
    options = {"never": [set()], "always": [candidates], "auto": [set(), candidates]}[policy]
    if graph.spec.flow.asynchronous is not None:  # training runs beside the loop: nobody can swap out
        options = [set()]
    for offloaded in options:
        if fits(placements, phases, offloaded, cluster, profile) is None:
            return offloaded
    reason = fits(placements, phases, options[-1], cluster, profile)
    if graph.spec.flow.asynchronous is not None:
        reason += "; under flow.async every worker stays resident (training overlaps the loop), or drop flow.async"
    elif policy == "never":
        reason += "; or let workers swap out between phases: placement.offload=auto"
    raise OffloadInfeasible(reason)


def fits(
    placements: dict[str, Placement], phases: list[Phase], offloaded: set[str], cluster: Cluster, profile: Profile
) -> str | None:
    """None if every device holds its peak; else what overflows, and the fixes."""
    for device, (need, names) in peak_memory(placements, phases, offloaded, profile).items():
        capacity = cluster.memory_gb[device]
        if need > capacity:
            parts = ", ".join(f"workers.{n} {profile.memory_gb.get(n, 0.0):g} GB" for n in names)
            swap = "even with offload, " if offloaded else ""
            advice = "".join(f"; workers.{n}: {profile.memory_advice[n]}" for n in names if n in profile.memory_advice)
            return (
                f"device {device.name} would hold {need:g} GB ({parts}) but has {capacity:g} GB;"
                f" {swap}spread the workers over more devices, lower their memory (fewer envs per process,"
                f" smaller model), or add devices{advice}"
            )
    return None
