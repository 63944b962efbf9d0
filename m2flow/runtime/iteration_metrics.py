"""What an iteration reports and what a run measured: an iteration's metrics, env steps and replacements;
seconds per port and per device beside the plan's prediction; the step accounting between the loop and
training; and the reduction of the replicas' metric dicts (a mean, or a sum for shares that add up)."""

from __future__ import annotations

import numbers
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from m2flow.cluster import DeviceId
from m2flow.errors import WorkerError
from m2flow.runtime.replace import Replacement
from m2flow.runtime.spans import Spans
from m2flow.schedule import ReplicaId


@dataclass
class IterationResult:
    metrics: dict[str, float] = field(default_factory=dict)
    env_steps: int = 0
    replacements: list[Replacement] = field(default_factory=list)


@dataclass
class Measured:
    """Seconds spent per port, and when each device was busy, over the run: to set beside the plan's
    prediction."""

    port_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    device_spans: dict[DeviceId, Spans] = field(default_factory=dict)
    loop_s: float = 0.0  # the loop phases' wall time
    loop_busy_s: dict[ReplicaId, dict[str, float]] = field(default_factory=dict)  # replica -> port -> seconds
    warming_up: bool = True  # the controller's first iteration: not counted
    since: float = float("-inf")  # devices' work before it is not counted (a call of the warm-up still running)

    def add(self, port: str, seconds: float) -> None:
        self.port_s[port] += seconds

    def busy(self, device: DeviceId) -> Spans:
        """The spans of work on `device`, to add to."""
        if device not in self.device_spans:
            self.device_spans[device] = Spans(since=self.since)
        return self.device_spans[device]

    def settle(self, before: float) -> None:
        """Fold every device's spans that ended by `before` (no call in flight started earlier)."""
        for spans in self.device_spans.values():
            spans.settle(before)

    def copy(self) -> Measured:
        """A copy to return to when an iteration's costs must not count (cheaper than a deep copy)."""
        return Measured(
            defaultdict(float, self.port_s),
            {device: spans.copy() for device, spans in self.device_spans.items()},
            self.loop_s,
            {replica: defaultdict(float, ports) for replica, ports in self.loop_busy_s.items()},
            self.warming_up,
            self.since,
        )

    @property
    def device_s(self) -> dict[DeviceId, float]:
        """Seconds each device was busy: work that overlapped on it counts once."""
        return {device: spans.total() for device, spans in self.device_spans.items()}


def check_accounting(it: int, env_steps: int, metrics: dict[str, float]) -> None:
    """Steps produced by the loop = steps consumed, for every consumer that reports `.../steps_consumed`;
    records the steps produced."""
    metrics["accounting/steps_produced"] = float(env_steps)
    for key, steps in metrics.items():
        if key.endswith("/steps_consumed") and int(steps) != env_steps:
            raise WorkerError(
                f"iteration {it}: the loop produced {env_steps} env steps but {key} reports"
                f" {int(steps)}: steps were lost or counted twice between the loop and training"
            )


def sum_of_dicts(items: list[Any], suffix: str) -> dict[str, float]:
    """The sum of each key ending in `suffix` over the dicts among `items`."""
    sums: dict[str, float] = defaultdict(float)
    for item in items:
        if isinstance(item, dict):
            for key, value in item.items():
                if key.endswith(suffix):
                    sums[key] += float(value)
    return dict(sums)


def mean_of_dicts(items: list[Any]) -> dict[str, float]:
    """The mean of each numeric key over the dicts among `items` (each key over the dicts that have it): Python and
    numpy numbers, and arrays of one element."""
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for item in items:
        if isinstance(item, dict):
            for key, value in item.items():
                number = _number(value)
                if number is not None:
                    sums[key] += number
                    counts[key] += 1
    return {key: sums[key] / counts[key] for key in sums}


def _number(value: Any) -> float | None:
    """A metric's value as a float: a Python or numpy number, or an array of one; None for anything else."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real | np.ndarray | np.generic):
        return None
    array = np.asarray(value)
    if array.size != 1 or not np.issubdtype(array.dtype, np.number):
        return None
    return float(array.reshape(-1)[0])
