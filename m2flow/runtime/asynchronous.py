"""How the controller runs an asynchronous flow (`flow.async`): which phases run in an iteration, and the
training issued beside the loop. `Controller` mixes it in, as it does `in_place.InPlace`: these steps use
the controller's phases, backlog and metrics (`_run`, `_then_phase`, `_record`, `_then_metrics`,
`_add_time`); `m2flow.overlap` decides when training may run and `batches.py` holds the queue of batches.
"""

from __future__ import annotations

import time

from m2flow.runtime.batches import check_staleness
from m2flow.runtime.rank_naming import naming_ranks
from m2flow.runtime.waits import wait_all
from m2flow.schedule import Phase


class Asynchronous:
    """The controller's scheduling of an asynchronous flow (module doc)."""

    def _runs(self, phase: Phase) -> bool:
        """Whether `phase` runs now. An asynchronous flow first fills its queue of batches before training,
        and runs the loop beside training only while the segment needs more batches."""
        due = phase.runs_at(self._it)
        if self.overlap is None:
            return due
        if self.overlap.drops:
            return self._runs_dropping(phase, due)
        if not due:
            return False
        if phase.op == "then":
            loop = next(p for p in self.plan.phases if p.op == "loop")
            for _ in range(self.overlap.fills(self._it, self.backlog.collected, self._last)):
                self._run(loop)
            return True
        if phase.op == "loop":
            return self.overlap.prefetches(self._it, self.backlog.collected, self._last)
        return True

    def _runs_dropping(self, phase: Phase, due: bool) -> bool:
        """Drop mode: the loop never waits. Syncs wait for the training in flight (`Backlog.sync_runs`);
        training starts when the last one is done, on the oldest batch within the bound (older ones are
        dropped)."""
        backlog = self.backlog
        if phase.op == "sync":
            return backlog.sync_runs(phase, due)
        if phase.op == "then":
            if backlog.training is not None:
                return False
            self._drop_stale()
            return bool(backlog.batches)
        return due

    def _drop_stale(self) -> None:
        """Drop mode: queued batches over the bound if trained now are dropped, their steps counted."""
        metrics = self._result.metrics
        for batch in self.backlog.stale():
            metrics["async/dropped_batches"] = metrics.get("async/dropped_batches", 0.0) + 1
            metrics["async/dropped_steps"] = metrics.get("async/dropped_steps", 0.0) + batch.env_steps

    def _poll_training(self) -> None:
        """Drop mode: training issued earlier is finished if it is done (or past its deadline: it raises)."""
        if self.backlog.training is not None and self.backlog.training.done():
            self._finish_training()

    def _catch_up(self) -> None:
        """Drop mode at a segment's end: training finishes and trains what is still within the bound, so no
        batch is pending at a checkpoint; then the syncs it owes."""
        began, backlog = time.time(), self.backlog
        then = self._then_phase()
        while backlog.training is not None or backlog.batches:
            if backlog.training is not None:
                self._finish_training()
            self._drop_stale()
            if backlog.batches:
                self._run(then)
        for phase in (p for p in self.plan.phases if p.op == "sync"):
            if backlog.sync_runs(phase, due=False):
                self._run(phase)
        self._add_time("time/train_wait_s", began)

    def _finish_training(self) -> None:
        """Wait for the training issued beside the loop (its deadline counts from its issue); its metrics
        are this iteration's."""
        training = self.backlog.training
        with naming_ranks(self.launch):
            events = wait_all(training.calls, training.deadline)
        self.backlog.finish()
        self._record(events, training.calls)
        self._then_metrics(training.produced, training.batch.env_steps)
        metrics = self._result.metrics
        check_staleness(metrics, self.overlap.max_staleness, self._it)
        metrics["async/collected_at"] = float(training.batch.collected_at)
        metrics["async/staleness"] = float(training.lag)
        metrics["async/trained_batches"] = metrics.get("async/trained_batches", 0.0) + 1
