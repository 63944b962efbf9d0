"""Simulator replicas replaced in place (`run.on_failure: replace`): which may be, and the wait on a loop
that may lose some of them.

Physics simulators crash and hang far more often than trainers; one that does should cost its own part
of the iteration, not the job. A simulator replica is replaceable when it runs in a process of its own
and takes part in no sync edge whose group meets (`Launch.replaceable`), while the run's budget of
replacements lasts. Its peers drop it from the loop (`loop.py`); the controller replaces it and redoes
its shards.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from m2flow.errors import WaitTimeout, WorkerError
from m2flow.runtime.host import PortFailed, headline
from m2flow.runtime.launch import Launch, Replica
from m2flow.runtime.loop import Dropped, LoopStats
from m2flow.runtime.quarantine import Quarantine
from m2flow.runtime.waits import Deadline, get, wait_all
from m2flow.schedule import ReplicaId

Call = tuple[Any, Replica, str]  # (the event's object reference, the replica called, what the call does)
Failed = list[tuple[Replica, Dropped]]  # simulator replicas to replace, each with its failure
RestoreReplica = Callable[[Replica], str]  # sets a replacement's state; says what it is


@dataclass(frozen=True)
class Replacement:
    """A simulator replica replaced in place during the loop, and the part of the iteration it redid."""

    replica: ReplicaId
    iteration: int
    why: str
    state: str  # what its envs started from
    steps_redone: int
    detected_at: float  # when its failure was seen (time.time())
    seconds: float  # from then to the end of the redo
    env: int | None  # the env that failed, when the replica named it
    quarantined: bool  # whether that env was quarantined (started again from a new seed)


@dataclass(frozen=True)
class Started:
    """How a replacement started: what its envs started from, and whether its failure quarantined an env."""

    state: str
    quarantined: bool


class Replacer:
    """Replaces failed replicas of one launch's loop simulator in place, within the run's budget: each new
    process starts as `run.replacement_state` asks unless its failure quarantines an env (then every env
    resets, that one from a new seed), and each replacement is reported to the run as it is made, so a
    later failure of the same iteration neither hides it nor hands its budget back."""

    def __init__(
        self,
        launch: Launch,
        simulator: str,
        budget: int,
        restore: RestoreReplica,
        quarantine: Quarantine,
        report: Callable[[Replacement], None],
    ):
        self.launch, self.simulator, self.budget = launch, simulator, budget
        self.restore, self.quarantine, self.report = restore, quarantine, report

    def replaceable(self) -> frozenset[int]:
        """The simulator replicas that may be replaced in place now."""
        return droppable(self.launch, self.simulator, self.budget)

    def start(self, failed: Failed, where: str) -> dict[ReplicaId, Started]:
        """A new process for each failed replica; past the budget, the failure is the iteration's."""
        if len(failed) > self.budget:
            names, env = ", ".join(str(r.id) for r, _ in failed), failed[0][1].env
            times = self.quarantine.times.get(env, 0)
            hint = f"; env {env} still fails after {times} quarantine(s) from new seeds" if times else ""
            raise WorkerError(
                f"{names} failed {where} ({failed[0][1].why}); no in-place replacement left"
                f" (run.max_replacements){hint}"
            )
        self.budget -= len(failed)
        return {replica.id: self._start(replica, dropped) for replica, dropped in failed}

    def _start(self, replica: Replica, dropped: Dropped) -> Started:
        quarantined = self.quarantine.record(dropped.env)
        new = self.launch.replace(replica.id)
        if not quarantined:
            return Started(self.restore(new), quarantined=False)
        return Started(f"its envs reset, env {dropped.env} quarantined: started from a new seed", quarantined=True)

    def done(self, replica: Replica, dropped: Dropped, started: Started, iteration: int, steps: int) -> Replacement:
        """The replacement of `replica`, its `steps` redone, reported to the run."""
        replacement = Replacement(
            replica=replica.id,
            iteration=iteration,
            why=dropped.why,
            state=started.state,
            steps_redone=steps,
            detected_at=dropped.at,
            seconds=time.time() - dropped.at,
            env=dropped.env,
            quarantined=started.quarantined,
        )
        self.report(replacement)
        return replacement


def droppable(launch: Launch, simulator: str, budget: int) -> frozenset[int]:
    """The replicas of the loop's simulator that may be replaced in place now."""
    if budget <= 0:
        return frozenset()
    return frozenset(r.index for r in launch.replicas[simulator] if launch.replaceable(r.id) is None)


def await_loop(
    calls: list[Call], processes: list[list[Replica]], deadline: Deadline, simulator: str, droppable: frozenset[int]
) -> tuple[list[dict[str, LoopStats] | None], dict[int, Dropped]]:
    """Each process's loop stats, or None for a failed one that is replaced: one hosting only droppable
    replicas that raised or died, or whose peers dropped all it hosts (it hangs). Those are killed (their
    peers see the channel close) with when and why they failed. Any other failure raises at once, as
    `wait_all` does."""
    import ray

    results: list[dict[str, LoopStats] | None] = [None] * len(calls)
    failed: dict[int, Dropped] = {}
    pending = {ref: i for i, (ref, _, _) in enumerate(calls)}

    def replaceable(i: int) -> bool:
        return all(r.worker == simulator and r.index in droppable for r in processes[i])

    def fail(i: int, dropped: Dropped) -> None:
        failed[i] = dropped
        ray.kill(processes[i][0].process, no_restart=True)

    while pending:
        lost = _lost(results, simulator)
        for ref, i in list(pending.items()):
            if replaceable(i) and all(r.id in lost for r in processes[i]):
                seen = lost[processes[i][0].id]
                own = _own_failure(ref, calls[i])  # what it raised, if it did: it may name the env that failed
                fail(i, seen if own is None else dataclasses.replace(own, at=seen.at))
                del pending[ref]
        if not pending:
            break
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, deadline.left()))
        if not ready:
            wait_all([calls[i] for i in pending.values()], deadline)  # raises the usual timeout, naming them
        for ref in ready:
            i = pending.pop(ref)
            try:
                results[i] = get(ref, calls[i][1], calls[i][2])
            except (WorkerError, WaitTimeout) as exc:
                if not replaceable(i):
                    raise
                fail(i, _dropped(exc))
    return results, failed


def await_calls(
    calls: list[Call], deadline: Deadline, replaceable: frozenset[ReplicaId]
) -> tuple[list[Any], dict[int, Dropped]]:
    """Each call's result, or None for a call of a `replaceable` replica that raised, died or is still
    running at the deadline (hung), with when and why; any other failure raises, as `wait_all` does."""
    import ray

    results: list[Any] = [None] * len(calls)
    failed: dict[int, Dropped] = {}
    pending = {ref: i for i, (ref, _, _) in enumerate(calls)}
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, deadline.left()))
        if not ready:
            if any(calls[i][1].id not in replaceable for i in pending.values()):
                wait_all([calls[i] for i in pending.values()], deadline)  # raises the usual timeout, naming them
            for i in pending.values():
                failed[i] = Dropped(time.time(), f"{calls[i][1].id} still in {calls[i][2]} after {deadline.seconds:g}s")
            break
        i = pending.pop(ready[0])
        try:
            results[i] = get(ready[0], calls[i][1], calls[i][2])
        except (WorkerError, WaitTimeout) as exc:
            if calls[i][1].id not in replaceable:
                raise
            failed[i] = _dropped(exc)
    return results, failed


def _dropped(exc: WorkerError | WaitTimeout) -> Dropped:
    """A replica's own failure, seen now."""
    return Dropped(time.time(), headline(exc), exc.env if isinstance(exc, PortFailed) else None)


def _own_failure(ref: Any, call: Call) -> Dropped | None:
    """The failure a process already raised itself (None: it has not, or it has not finished)."""
    import ray

    if not ray.wait([ref], timeout=0)[0]:
        return None
    try:
        get(ref, call[1], call[2])
    except (WorkerError, WaitTimeout) as exc:
        return _dropped(exc)
    return None


def _lost(results: list[dict[str, LoopStats] | None], simulator: str) -> dict[ReplicaId, Dropped]:
    """Simulator replicas that peers dropped from the loop, each with the first report of it."""
    lost: dict[ReplicaId, Dropped] = {}
    for by_worker in filter(None, results):
        for stats in by_worker.values():
            for index, dropped in stats.lost.items():
                replica = ReplicaId(simulator, index)
                if replica not in lost or dropped.at < lost[replica].at:
                    lost[replica] = dropped
    return lost
