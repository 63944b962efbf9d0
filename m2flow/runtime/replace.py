"""Loop replicas replaced in place (`run.on_failure: replace`): which may be, and their new processes (the
waits that may lose some of them are `replica_waits.py`'s).

Physics simulators crash and hang far more often than trainers; one that does should cost its own part
of the iteration, not the job. A simulator or inference replica of the loop is replaceable when it runs
in a process of its own and is no rank of a process group (`Launch.replaceable`; a weight-sync group
meets again with the new process), an inference replica also when nothing but the loop reads it (no
after-loop edge leaves its worker: it holds no part of the batch) and the flow is synchronous, while the
run's budget of replacements lasts. A failed simulator's peers drop it from the loop (`loop.py`); the
simulators a failed inference replica served stop, naming it. The controller replaces them all and
redoes the failed simulators' shards (`in_place.py`). One that fails while it receives weights is
replaced and synced again (`replica_waits.await_transfer` tells its failure from the source's). A training worker whose
rank fails while it trains is restarted whole from the checkpoint written right before the iteration
(`training_groups`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from m2flow.errors import WorkerError
from m2flow.graph import MacroGraph
from m2flow.runtime.crashes import crashes_of
from m2flow.runtime.launch import Launch
from m2flow.runtime.loop import Dropped
from m2flow.runtime.quarantine import Quarantine
from m2flow.runtime.relocate import Move
from m2flow.runtime.replica import Replica
from m2flow.schedule import ReplicaId

Failed = list[tuple[Replica, Dropped]]  # loop replicas to replace, each with its failure


@dataclass(frozen=True)
class Restore:
    """Where replacements get their state: the run's checkpoints."""

    replica: Callable[[Replica, bool], str]  # sets a loop replacement's state (its envs anew?); says what it is
    checkpoint_before: Callable[[int], Path | None]  # the checkpoint written right before an iteration, if any
    workers: Callable[[Path, list[str]], None]  # every replica of these workers restored from a checkpoint


@dataclass(frozen=True)
class Replacement:
    """A replica replaced in place (a training worker: the rank that failed), and the env steps redone."""

    replica: ReplicaId
    iteration: int
    why: str
    state: str  # what it started from
    steps_redone: int
    detected_at: float  # when its failure was seen (time.time())
    seconds: float  # from then to the end of the redo
    env: int | None  # the env that failed, when the replica or its crash record named it
    quarantined: bool  # whether that env was quarantined (started again from a new seed)
    spare: bool  # whether its new process was a spare started ahead (`run.spares`)
    moved: Move | None = None  # off the device it ran on, whose node no longer answered (`relocate.py`)


@dataclass(frozen=True)
class Started:
    """How a replacement started: what it started from, the failure it stands in for (with the env a crash
    of the old process named), and whether that failure quarantined an env."""

    state: str
    failure: Dropped
    quarantined: bool


class Replacer:
    """Replaces failed replicas of one launch in place, within the run's budget, and reports each to the
    run as it is made, so a later failure of the same iteration neither hides it nor hands its budget back.

    Loop replicas: each new simulator process starts as `run.replacement_state` asks unless its failure
    quarantines an env (then every env resets, that one from a new seed). Training workers (`groups`): a
    worker whose rank fails while it trains on the iteration's batch is started again whole (its process
    group meets again) from the checkpoint written right before the iteration, the state it had when the
    phase began; the controller gives it the phase's calls again."""

    def __init__(
        self,
        launch: Launch,
        candidates: list[ReplicaId],
        groups: list[str],
        budget: int,
        restore: Restore,
        quarantine: Quarantine,
        report: Callable[[Replacement], None],
    ):
        self.launch, self.candidates, self.groups, self.budget = launch, candidates, groups, budget
        self.restore, self.quarantine, self.report = restore, quarantine, report

    def replaceable(self) -> frozenset[ReplicaId]:
        """The loop replicas that may be replaced in place now."""
        return droppable(self.launch, self.candidates, self.budget)

    def standing(self) -> list[ReplicaId]:
        """The replicas whose failure would start new processes now: the loop replicas that may be replaced
        and every rank of the training workers that restart in place."""
        if self.budget <= 0:
            return []
        ranks = [r.id for worker in self.groups for r in self.launch.replicas[worker]]
        return sorted(self.replaceable()) + ranks

    def start(self, failed: Failed, where: str) -> dict[ReplicaId, Started]:
        """A new process for each failed replica; past the budget, the failure is the iteration's. A
        simulator whose process crashed working on an env (`crashes.py`) failed in that env."""
        failed = self._blamed(failed)
        if len(failed) > self.budget:
            names, env = ", ".join(str(r.id) for r, _ in failed), failed[0][1].env
            times = self.quarantine.times.get(env, 0)
            hint = f"; env {env} still fails after {times} quarantine(s) from new seeds" if times else ""
            raise WorkerError(
                f"{names} failed {where} ({failed[0][1].why}); no in-place replacement left"
                f" (run.max_replacements){hint}"
            )
        self.launch.relocate([replica.id for replica, _ in failed])  # may fail the iteration: before any count
        self.budget -= len(failed)
        quarantined = [self.quarantine.record(dropped.env) for _, dropped in failed]  # before they are built
        fresh = self.launch.replace([replica.id for replica, _ in failed])
        return {
            new.id: Started(
                f"{self.restore.replica(new, True)}, env {dropped.env} quarantined: started from a new seed",
                dropped,
                True,
            )
            if env_quarantined
            else Started(self.restore.replica(new, False), dropped, False)
            for new, (_, dropped), env_quarantined in zip(fresh, failed, quarantined, strict=True)
        }

    def _blamed(self, failed: Failed) -> Failed:
        """`failed`, each replica whose process crashed with how it crashed; a simulator's with the env it
        was working on then, unless it named one itself."""
        launch = self.launch
        crashes = crashes_of(launch.processes.of, launch.output_dir, [replica.id for replica, _ in failed])
        simulator = launch.graph.loop.entry.worker
        blamed = []
        for replica, dropped in failed:
            crash = crashes.get(replica.id)
            if crash is not None:
                env = dropped.env if dropped.env is not None or replica.worker != simulator else crash.env
                dropped = dataclasses.replace(dropped, why=f"{dropped.why}; {crash}", env=env)
            blamed.append((replica, dropped))
        return blamed

    def group_checkpoint(self, worker: str, iteration: int) -> Path | None:
        """The checkpoint `worker` may restart in place from in `iteration`'s after-loop phase (None: it may
        not: not a training worker of its own processes, no budget left, or no checkpoint right before)."""
        if worker not in self.groups or self.budget <= 0:
            return None
        return self.restore.checkpoint_before(iteration)

    def restart_group(self, worker: str, checkpoint: Path, dropped: Dropped) -> Started:
        """Every replica of `worker` in a new process (a process group meets again), restored from
        `checkpoint`; past the budget, the failure is the iteration's."""
        if self.budget <= 0:
            raise WorkerError(f"'{worker}' failed ({dropped.why}); no in-place replacement left (run.max_replacements)")
        fresh = self.launch.restart_worker(worker)  # may fail the iteration (a rank's node lost): before the count
        self.budget -= 1
        self.restore.workers(checkpoint, [worker])
        return Started(
            f"'{worker}' restarted whole, {len(fresh)} process(es) from {checkpoint.name}; it trains on the same batch",
            dropped,
            False,
        )

    def done(self, replica: Replica, started: Started, iteration: int, steps: int) -> Replacement:
        """The replacement of `replica`, its `steps` redone, reported to the run."""
        dropped = started.failure
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
            spare=replica.id in self.launch.from_spare,
            moved=self.launch.relocator.moves.get(replica.id),
        )
        self.report(replacement)
        return replacement


def candidates(graph: MacroGraph) -> tuple[list[ReplicaId], list[str]]:
    """The loop replicas a replacement may stand in for, and why each other loop worker's may not."""
    loop, fed = graph.loop, {edge.src.worker for edge in graph.then}
    entry, ids, why_not = loop.entry.worker, [], []
    for worker in loop.workers:
        if worker != entry and worker in fed:
            why_not.append(f"'{worker}' hands its outputs to an after-loop edge (part of the batch)")
            continue
        if worker != entry and graph.spec.flow.asynchronous is not None:
            why_not.append(f"'{worker}' is an inference worker of an asynchronous flow (training runs beside it)")
            continue
        ids += [ReplicaId(worker, r) for r in range(graph.workers[worker].count)]
    return ids, why_not


def training_groups(graph: MacroGraph, launch: Launch) -> tuple[list[str], list[str]]:
    """The workers a rank failure of which in the after-loop phase restarts in place (called there, outside
    the loop, each replica a process of its own, handing nothing to another after-loop port), and why each
    other after-loop worker may not."""
    loop = set(graph.loop.workers) if graph.loop is not None else set()
    called = sorted({edge.dst.worker for edge in graph.then} - loop)
    feeds = {edge.src.worker for edge in graph.then}
    groups, why_not = [], []
    for worker in called:
        if graph.info[worker].kind != "training":
            why_not.append(f"'{worker}' is not a training worker")
        elif graph.spec.flow.asynchronous is not None:
            why_not.append(f"'{worker}' trains beside the loop (flow.async)")
        elif worker in feeds:
            why_not.append(f"'{worker}' hands its outputs to another after-loop port")
        elif not launch.own_processes(worker):
            why_not.append(f"'{worker}' shares its processes with other workers (placement.colocate)")
        else:
            groups.append(worker)
    return groups, why_not


def droppable(launch: Launch, candidates: list[ReplicaId], budget: int) -> frozenset[ReplicaId]:
    """The `candidates` that may be replaced in place now."""
    if budget <= 0:
        return frozenset()
    return frozenset(r for r in candidates if launch.replaceable(r) is None)
