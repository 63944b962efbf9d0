"""Asynchronous flows (`flow.async`): which loops an iteration runs beside its training, and how stale
each trained batch is — one schedule, read by the controller that runs it and the planner that explains it.

Iteration i trains batch i. Batch b is collected by a loop run with the weights of the iteration that runs
it, so a batch collected in iteration j and trained in iteration b is b - j policy versions old. Training
catches up at the end of each *segment* (a checkpoint, a re-plan, the run's end): no batch is pending
there, so a checkpoint holds no half-finished work. At a segment's start the loop first fills the queue:
batches i..i+k-1 are collected before batch i trains (fresher than k versions); from then on each
iteration collects batch i+k while batch i trains, k versions late.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Overlap:
    max_staleness: int

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

    def explain(self, segment: int) -> str:
        """What the staleness bound means for a segment of `segment` iterations."""
        lags = self.staleness(0, segment - 1)
        return (
            f"async: training overlaps the loop; each batch trains {self.max_staleness} policy version(s) after the"
            f" one that collected it (mean {sum(lags) / len(lags):.2f} over a {segment}-iteration segment: the"
            " loop waits for training at each checkpoint)"
        )
