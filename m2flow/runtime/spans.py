"""Busy time as the union of spans of work: where several processes work on one device at once (inference
and training on one GPU under `flow.async`, colocated replicas, renderers beside a policy), the device is busy
for the union of their spans, not the sum of their seconds."""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field


@dataclass
class Spans:
    """Disjoint spans [start, end), sorted and merged as they arrive, from `since` on (earlier work is cut).
    `settle(before)` folds the spans that end before a time no later span can reach back past into a total,
    so a long run holds only the recent ones."""

    since: float = float("-inf")
    settled_s: float = 0.0
    starts: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)

    def add(self, start: float, end: float) -> None:
        start = max(start, self.since)
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

    def update(self, other: Spans) -> None:
        """Add every span `other` holds (another process's work on the same device)."""
        for start, end in zip(other.starts, other.ends, strict=True):
            self.add(start, end)

    def settle(self, before: float) -> None:
        """Fold the spans that end by `before` into the total: no span added later may start before it (the
        caller's promise: every call that started earlier has been added). A later span is cut where the
        folded ones end, so no time counts twice."""
        n = bisect_right(self.ends, before)
        self.settled_s += sum(e - s for s, e in zip(self.starts[:n], self.ends[:n], strict=True))
        del self.starts[:n], self.ends[:n]
        self.since = max(self.since, min(before, self.starts[0]) if self.starts else before)  # past what folded

    def copy(self) -> Spans:
        return Spans(self.since, self.settled_s, self.starts.copy(), self.ends.copy())

    def total(self) -> float:
        """Seconds covered by at least one span."""
        return self.settled_s + sum(e - s for s, e in zip(self.starts, self.ends, strict=True))

    def __len__(self) -> int:
        return len(self.starts)
