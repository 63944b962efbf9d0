"""What an asynchronous flow's controller keeps between iterations: batches collected by a loop and not
yet trained, the training issued beside the loop, and the check that no sample trained too stale."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from m2flow.errors import M2FlowError
from m2flow.runtime.launch import Replica
from m2flow.runtime.waits import Deadline
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
