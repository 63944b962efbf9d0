"""Asynchronous flows (`flow.async`): which loops an iteration runs beside its training, and how stale
each trained batch is — one schedule, read by the controller that runs it and the planner that explains it.

Iteration i trains batch i. Batch b is collected by a loop run with the weights of the iteration that runs
it, so a batch collected in iteration j and trained in iteration b is b - j policy versions old. Training
catches up at the end of each *segment* (a checkpoint, a re-plan, the run's end): no batch is pending
there, so a checkpoint holds no half-finished work. At a segment's start the loop first fills the queue:
batches i..i+k-1 are collected before batch i trains (fresher than k versions); from then on each
iteration collects batch i+k while batch i trains, k versions late.

That is `on_stale: block`: the loop waits for training. Under `on_stale: drop` the loop never waits:
training starts whenever it is free, on the oldest queued batch within the bound, and batches older
than that are dropped (`stale`); a batch's lag is counted in trainings finished since its loop ran.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from m2flow.spec import AsyncSpec


@dataclass(frozen=True)
class Overlap:
    max_staleness: int
    drops: bool = False  # on_stale: drop (else block)

    @classmethod
    def of(cls, asynchronous: AsyncSpec) -> Overlap:
        return cls(asynchronous.max_staleness, drops=asynchronous.on_stale == "drop")

    def fills(self, iteration: int, collected: int, last: int) -> int:
        """Loops to run before iteration `iteration` trains (batches `collected`.. are not yet collected;
        `last` ends the segment)."""
        until = max(iteration, min(iteration + self.max_staleness - 1, last))
        return max(0, until + 1 - collected)

    def prefetches(self, iteration: int, collected: int, last: int) -> bool:
        """Whether the iteration's loop runs beside its training (collecting batch `collected`)."""
        return collected <= min(iteration + self.max_staleness, last)

    def staleness(self, first: int, last: int) -> list[int]:
        """The policy versions each batch of the segment first..last lags when it trains."""
        collected_at: list[int] = []
        for i in range(first, last + 1):
            collected = first + len(collected_at)
            collected_at += [i] * self.fills(i, collected, last)
            if self.prefetches(i, first + len(collected_at), last):
                collected_at.append(i)
        return [batch - at for batch, at in zip(range(first, last + 1), collected_at, strict=True)]

    def stale(self, versions: list[int], version: int) -> int:
        """Drop mode: how many queued batches (oldest first, each with the version whose loop collected it)
        are over the bound if trained at `version`: the oldest, as versions only grow."""
        return sum(1 for collected in versions if version - collected > self.max_staleness)

    def trains_one_in(self, loop_s: float, train_s: float) -> int:
        """Drop mode: batches the loop collects per one trained, when a training takes `train_s` and a loop
        `loop_s` (training is checked for at each loop's end, so it holds ceil(train/loop) loops)."""
        return max(1, math.ceil(train_s / loop_s - 1e-9)) if loop_s > 0 else 1

    def explain(self, segment: int, loop_s: float = 0.0, train_s: float = 0.0) -> str:
        """What the staleness bound means for a segment of `segment` iterations (drop mode: for a loop of
        `loop_s` beside a training of `train_s`)."""
        if self.drops:
            one_in = self.trains_one_in(loop_s, train_s)
            kept = "every batch trains" if one_in == 1 else f"about 1 batch in {one_in} trains, the others are dropped"
            return (
                f"async (on_stale: drop): the loop never waits for training ({train_s:.3g}s predicted beside a"
                f" {loop_s:.3g}s loop): {kept}; a batch trains at most {self.max_staleness} policy version(s) after"
                " the one that collected it (older ones are dropped)"
            )
        lags = self.staleness(0, segment - 1)
        return (
            f"async: training overlaps the loop; each batch trains {self.max_staleness} policy version(s) after the"
            f" one that collected it (mean {sum(lags) / len(lags):.2f} over a {segment}-iteration segment: the"
            " loop waits for training at each checkpoint)"
        )
