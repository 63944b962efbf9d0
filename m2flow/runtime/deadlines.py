"""How long each wait may last: derived from the plan's prediction unless the user fixed it."""

from __future__ import annotations

from dataclasses import dataclass

from m2flow.schedule import Plan
from m2flow.spec import TimeoutSpec


@dataclass(frozen=True)
class Deadlines:
    phase_s: dict[str, float]
    channel_s: float
    silence_s: float  # a loop peer silent this long is hung, however long its channel deadline (at most that)
    start_s: float
    explain: str

    def phase(self, op: str) -> float:
        return self.phase_s.get(op, max(self.phase_s.values(), default=self.start_s))

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
        return cls(phases, channel, silence, timeouts.start_s, explain)
