"""Busy time as the union of spans of work: where several processes work on one device at once (inference
and training on one GPU under `flow.async`, colocated replicas, renderers beside a policy), the device is busy
for the union of their spans, not the sum of their seconds."""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field

HELD = 1024  # spans kept apart before the oldest half is folded into a total


@dataclass
class Spans:
    """Disjoint spans [start, end), sorted and merged as they arrive. Spans arrive nearly in time order, so
    the oldest are folded into `settled_s` once more than `held` are kept: memory stays bounded over a long
    run, and only a span that reaches back past the folded ones (none in practice) is counted whole."""

    held: int = HELD
    settled_s: float = 0.0
    starts: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)

    def add(self, start: float, end: float) -> None:
        if end <= start:
            return
        i = bisect_right(self.starts, start)
        if i > 0 and self.ends[i - 1] >= start:  # joins the span before it
            i -= 1
            start, end = self.starts[i], max(end, self.ends[i])
        j = i
        while j < len(self.starts) and self.starts[j] <= end:  # swallows the spans it reaches
            end = max(end, self.ends[j])
            j += 1
        self.starts[i:j] = [start]
        self.ends[i:j] = [end]
        if len(self.starts) > self.held:
            half = self.held // 2
            self.settled_s += sum(e - s for s, e in zip(self.starts[:half], self.ends[:half], strict=True))
            del self.starts[:half], self.ends[:half]

    def update(self, other: Spans) -> None:
        """Add every span of `other` (another process's work on the same device)."""
        self.settled_s += other.settled_s
        for start, end in zip(other.starts, other.ends, strict=True):
            self.add(start, end)

    def copy(self) -> Spans:
        return Spans(self.held, self.settled_s, self.starts.copy(), self.ends.copy())

    def total(self) -> float:
        """Seconds covered by at least one span."""
        return self.settled_s + sum(e - s for s, e in zip(self.starts, self.ends, strict=True))
