"""What the simulations of one placement and program share (`planners/simulate.py`): the phases outside the loop,
recorded by the first simulation of a process layout and replayed by its other stage counts, and the loop's classes
of components (`planners/symmetry.py`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from m2flow.cluster import DeviceId
from m2flow.graph import MacroGraph
from m2flow.planners.processes import Processes, same_process
from m2flow.planners.render import ReplicaPort
from m2flow.planners.symmetry import LoopClass, loop_classes
from m2flow.schedule import ReplicaId

Layout = tuple[tuple[ReplicaId, ...], ...]  # a process layout (`Processes`) as a key


@dataclass
class PhaseRecord:
    """A phase outside the loop as one simulation ran it: what it added to the clock and to the phases' times
    (in that order), and its tasks' own work per device and per port. Its tasks wait on nothing the loop did
    and cross no channel hop, so its schedule is the same whatever the loop's stage count; not whatever the
    process layout, since co-hosted replicas call in turn where apart they share their core."""

    advances: list[tuple[str, float, float]]  # (the phase time it adds to, seconds added there, to the clock)
    busy: dict[DeviceId, float]
    port_s: dict[str, float]


@dataclass
class Shared:
    """What the simulations of one placement and program share: its phases outside the loop, alike for every
    stage count of a process layout (the first simulation that runs one records it, the others replay it), and
    the loop's classes of components, alike for every stage count whose ports beside rendering are the same."""

    # by the process layout and the phase's index in the program
    outside: dict[tuple[Layout, int], PhaseRecord] = field(default_factory=dict)
    loop_classes: dict[tuple[Layout, frozenset[ReplicaPort]], list[LoopClass]] = field(default_factory=dict)
    inputs: tuple = ()  # the graph, placements, profile and phases of the simulations that share it

    def check(self, inputs: tuple) -> None:
        """Refuse to share with a simulation of other inputs (the same objects, not equal ones: a profile is
        refitted in place)."""
        if not self.inputs:
            self.inputs = inputs
        elif any(mine is not theirs for mine, theirs in zip(self.inputs, inputs, strict=True)):
            raise ValueError("Shared: one placement's simulations share it; these inputs are another's")

    def classes(
        self,
        graph: MacroGraph,
        devices: dict[str, list[DeviceId]],
        processes: Processes,
        beside_rendering: frozenset[ReplicaPort],
    ) -> list[LoopClass]:
        """The loop's classes of components for this process layout and these ports beside rendering."""
        key = (tuple(tuple(group) for group in processes), beside_rendering)
        if key not in self.loop_classes:
            self.loop_classes[key] = loop_classes(graph, devices, same_process(processes), beside_rendering)
        return self.loop_classes[key]
