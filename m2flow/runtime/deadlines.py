"""How long each wait may last: derived from the plan's prediction unless the user fixed it; a sync edge run
one iteration in k, from its own (`_periodic_syncs`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from m2flow.schedule import DEFAULT_SOURCE, Plan, guessed
from m2flow.spec import TimeoutSpec


@dataclass(frozen=True)
class Deadlines:
    phase_s: dict[str, float]
    channel_s: float
    silence_s: float  # a loop peer silent this long is hung, however long its channel deadline (at most that)
    start_s: float
    explain: str
    periodic_s: dict[str, float]  # a sync edge run one iteration in k (k > 1), by edge: its own deadline

    def phase(self, op: str) -> float:
        return self.phase_s.get(op, max(self.phase_s.values(), default=self.start_s))

    def sync(self, edge: str) -> float:
        """The deadline of the sync phase that moves `edge`."""
        return self.periodic_s.get(edge, self.phase("sync"))

    @property
    def collective_s(self) -> float:
        """How long one collective of a training group may wait on its ranks: twice its phase's deadline,
        so that the driver's wait passes its deadline first and names the ranks that did not arrive."""
        return 2 * self.phase("then")

    @property
    def reach_s(self) -> float:
        """How long a node may take to run a no-op task before it is taken for lost (asked after a failure):
        a call's deadline, the longest phase's, for the task imports and builds nothing; at most a start's."""
        return min(self.start_s, max(self.phase_s.values(), default=self.start_s))

    @classmethod
    def from_plan(cls, plan: Plan, timeouts: TimeoutSpec) -> Deadlines:
        def derived(predicted_s: float) -> float:
            return min(timeouts.ceiling_s, max(timeouts.floor_s, predicted_s * timeouts.safety_factor))

        predicted = plan.predicted
        phases = {op: timeouts.call_s or derived(seconds) for op, seconds in predicted.phase_s.items()}
        channel = timeouts.channel_s or derived(predicted.loop_step_s)
        silence = min(timeouts.silence_s, channel)  # in the loop: at most a channel deadline
        explain = (
            f"deadlines: x{timeouts.safety_factor:g} the predicted time, within"
            f" [{timeouts.floor_s:g}, {timeouts.ceiling_s:g}] s (run.timeouts)"
        )
        periodic = {} if timeouts.call_s else _periodic_syncs(plan, derived, timeouts.start_s)
        if periodic:
            explain += (
                "; a sync run one iteration in k waits k times the predicted, at least run.timeouts.start_s while its"
                " destination's cost is unmeasured"
            )
        return cls(phases, channel, silence, timeouts.start_s, explain, periodic)


def _periodic_syncs(plan: Plan, derived: Callable[[float], float], start_s: float) -> dict[str, float]:
    """The deadline of each sync edge that runs one iteration in k (k > 1; an evaluation, say): the prediction
    spreads its time over those k iterations, so it waits k times the sync phase's predicted time; and while its
    destination's cost is a guess (a call made one iteration in k is seldom among those a run measures, and the
    first builds what it needs: a filmed evaluation's renderer), at least as long as a start. The phase's time
    counts every sync edge's, those run each iteration too: loose for a large k, never short."""
    predicted, periodic = plan.predicted, {}
    for phase in plan.phases:
        if phase.op == "sync" and phase.every > 1:
            (edge,) = phase.edges
            seconds = derived(predicted.phase_s.get("sync", 0.0) * phase.every)
            if guessed(predicted.cost_sources.get(str(edge.dst), DEFAULT_SOURCE)):
                seconds = max(seconds, start_s)
            periodic[str(edge)] = seconds
    return periodic
