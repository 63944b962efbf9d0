"""What an asynchronous flow's controller keeps between iterations (`Backlog`): batches collected by a loop
and not yet trained, the training issued beside the loop, the trainings finished and the syncs owed; and
the check that no sample trained too stale."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from m2flow.errors import M2FlowError
from m2flow.overlap import Overlap
from m2flow.runtime.replica import Replica
from m2flow.runtime.waits import Deadline
from m2flow.schedule import Phase
from m2flow.spec import PortRef

Call = tuple[Any, Replica, str]  # (the event's object reference, the replica called, what the call does)


@dataclass
class Batch:
    """A loop's outputs for the after-loop edges, waiting to train."""

    collected_at: int  # the iteration whose loop (and weights) collected it
    version: int  # trainings the controller had seen finish when its loop ran (drop mode's lag counts from it)
    produced: dict[PortRef, list[Any]]  # the loop workers' after-loop ports' outputs
    env_steps: int


@dataclass
class Training:
    """An after-loop phase issued beside the loop, awaited once the loop is done."""

    calls: list[Call]
    produced: dict[PortRef, list[Any]]
    batch: Batch
    lag: int  # trainings finished since the batch's loop ran: the policy versions it trains late
    deadline: Deadline  # from its issue: drop mode polls it across loops
    issued_at: float  # when its phase began: none of its calls started earlier

    def done(self) -> bool:
        """Every call has finished, one has failed (the others may wait on it in a collective), or its
        deadline has passed: awaiting it now returns or raises at once."""
        import ray

        refs = [ref for ref, _, _ in self.calls]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        return len(ready) == len(refs) or self.deadline.left() <= 0 or any(_failed(ref) for ref in ready)


def _failed(ref: Any) -> bool:
    import ray

    try:
        ray.get(ref, timeout=0)
    except Exception:  # noqa: BLE001 - any error the call raised: awaiting it reports it
        return True
    return False


@dataclass
class Backlog:
    """An asynchronous flow's work in flight (`m2flow.overlap` says when each part runs): the batches
    collected and not trained, oldest first; the training issued beside the loop; the trainings finished,
    which count a batch's lag in policy versions; and, in drop mode, the syncs owed while training ran."""

    overlap: Overlap
    batches: deque[Batch] = field(default_factory=deque)
    collected: int = 0  # the next batch's index (block mode: batch i trains in iteration i)
    training: Training | None = None
    version: int = 0  # trainings finished
    owed: list[Phase] = field(default_factory=list)

    def refs(self) -> set[Any]:
        """References still needed: queued batches' outputs, and the training's (drop mode: across loops)."""
        pending = {ref for b in self.batches for refs in b.produced.values() for ref in refs}
        if self.training is not None:
            pending |= {ref for refs in self.training.produced.values() for ref in refs}
            pending |= {ref for ref, _, _ in self.training.calls}
        return pending

    def add(self, collected_at: int, produced: dict[PortRef, list[Any]], env_steps: int) -> None:
        self.batches.append(Batch(collected_at, self.version, produced, env_steps))
        self.collected += 1

    def issue(self, calls: list[Call], produced: dict[PortRef, list[Any]], deadline: Deadline, began: float) -> None:
        """Training on the oldest batch has been issued: `calls`, giving `produced`, from a phase begun at `began`."""
        batch = self.batches.popleft()
        self.training = Training(calls, produced, batch, self.version - batch.version, deadline, began)

    def finish(self) -> Training:
        """The training in flight is over (awaited by the caller): one policy version more."""
        training, self.training = self.training, None
        self.version += 1
        return training

    def stale(self) -> list[Batch]:
        """Drop mode: the queued batches over the bound if trained now, taken off the queue."""
        return [
            self.batches.popleft() for _ in range(self.overlap.stale([b.version for b in self.batches], self.version))
        ]

    def sync_runs(self, phase: Phase, due: bool) -> bool:
        """Drop mode: a sync that falls due while training runs is owed until that training is done (its
        source may be the worker training); an owed one runs as soon as it is."""
        if due and phase not in self.owed:
            self.owed.append(phase)
        if self.training is not None or phase not in self.owed:
            return False
        self.owed.remove(phase)
        return True

    def busy(self) -> set[int]:
        """The replicas (by id) still training: a call to them would wait for it."""
        return {id(r) for _, r, _ in self.training.calls} if self.training is not None else set()


def check_staleness(metrics: dict[str, float], bound: int, iteration: int) -> None:
    """Workers that record each sample's policy version report the oldest they trained on (`.../staleness_max`);
    one over the bound is a fault of the flow, not of a replica, so no restart would help."""
    for key, value in metrics.items():
        if key.endswith("/staleness_max") and value > bound:
            raise M2FlowError(
                f"iteration {iteration}: {key} is {value:g} policy versions, over flow.async.max_staleness ({bound}):"
                " the loop's inference worker acted with older weights than the flow gave it; check that the sync"
                " edge into it runs every iteration and that it reports the version it loaded"
            )
