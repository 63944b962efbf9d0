"""Loop replicas replaced in place (`run.on_failure: replace`): which may be, and the wait on a loop that
may lose some of them.

Physics simulators crash and hang far more often than trainers; one that does should cost its own part
of the iteration, not the job. A simulator or inference replica of the loop is replaceable when it runs
in a process of its own and is no rank of a process group (`Launch.replaceable`; a weight-sync group
meets again with the new process), an inference replica also when nothing but the loop reads it (no
after-loop edge leaves its worker: it holds no part of the batch) and the flow is synchronous, while the
run's budget of replacements lasts. A failed simulator's peers drop it from the loop (`loop.py`); the
simulators a failed inference replica served stop, naming it. The controller replaces them all and
redoes the failed simulators' shards (`in_place.py`). One that fails while it receives weights is
replaced and synced again (`await_transfer` tells its failure from the source's). A training worker whose
rank fails while it trains is restarted whole from the checkpoint written right before the iteration
(`training_groups`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from m2flow.errors import WaitTimeout, WorkerError
from m2flow.graph import MacroGraph
from m2flow.runtime.crashes import crashes_of
from m2flow.runtime.host import PortFailed, headline
from m2flow.runtime.launch import Launch, Replica
from m2flow.runtime.loop import Dropped, LoopStats, PeerLost
from m2flow.runtime.quarantine import Quarantine
from m2flow.runtime.relocate import Move
from m2flow.runtime.waits import Deadline, finished, get, next_ready, silent_timeout, wait_all
from m2flow.schedule import ReplicaId
from m2flow.spec import PortRef

Call = tuple[Any, Replica, str]  # (the event's object reference, the replica called, what the call does)
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


def await_loop(
    calls: list[Call],
    processes: list[list[Replica]],
    deadline: Deadline,
    simulator: str,
    droppable: frozenset[ReplicaId],
    alone_s: float,
) -> tuple[list[dict[str, LoopStats] | None], dict[int, Dropped]]:
    """Each process's loop stats, or None for a failed one that is replaced: one hosting only droppable
    replicas that raised or died, whose peers dropped all it hosts (it hangs), that a peer stopped for
    (`PeerLost`: it died or hangs), or still out at the deadline while others finished (it hangs where no
    peer waits on it: a process stopped in its last step, or as its result was on its way) — or `alone_s`
    after every process of the loop's other workers finished, when only simulators are left: their last
    actions are sent, a step is all they had left. Those are killed (their peers see the channel close) with
    when and why they failed. Any other failure raises at once, as `wait_all` does."""
    import ray

    results: list[dict[str, LoopStats] | None] = [None] * len(calls)
    failed: dict[int, Dropped] = {}
    pending = {ref: i for i, (ref, _, _) in enumerate(calls)}
    hosting = {r.id: i for i, group in enumerate(processes) for r in group}

    def replaceable(i: int) -> bool:
        return all(r.id in droppable for r in processes[i])

    def fail(i: int, seen: Dropped) -> None:
        """Process i failed as `seen` says; what it raised itself, if it did, may name the env that failed."""
        ref = calls[i][0]
        own = _own_failure(ref, calls[i])
        failed[i] = seen if own is None else dataclasses.replace(own, at=seen.at)
        pending.pop(ref, None)
        ray.kill(processes[i][0].process, no_restart=True)

    def blamed(dropped: Dropped) -> None:
        """A peer named by `PeerLost` fails too, unless it finished its part already."""
        i = hosting.get(ReplicaId(*dropped.peer)) if dropped.peer is not None else None
        if i is not None and calls[i][0] in pending:
            fail(i, dataclasses.replace(dropped, env=None, peer=None))

    def only_simulators_left() -> bool:
        """Every process hosting another worker's replica finished its loop; those left host simulators only."""
        served = all(
            results[i] is not None for i in range(len(calls)) if any(r.worker != simulator for r in processes[i])
        )
        return served and all(replaceable(i) for i in pending.values())

    alone = None  # the deadline of the simulators left alone
    while pending:
        lost = _lost(results, simulator)
        for i in list(pending.values()):
            if replaceable(i) and all(r.id in lost for r in processes[i]):
                fail(i, lost[processes[i][0].id])
        if not pending:
            break
        if alone is None and only_simulators_left():
            alone = Deadline(alone_s, "simulators whose peers finished the loop")
        waiting = deadline if alone is None or alone.left() > deadline.left() else alone
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, waiting.left()))
        if not ready:
            hung = list(pending.values())
            if len(hung) == len(calls) or not all(replaceable(i) for i in hung):  # none done: the loop is slow
                wait_all([calls[i] for i in hung], deadline)  # raises the usual timeout, naming them
            for i in hung:  # no peer waits on them (their part was done, its result stuck on its way): hung
                why = _still(calls[i], deadline) if waiting is deadline else _alone(calls[i], alone_s)
                fail(i, Dropped(time.time(), why))
            break
        for ref in ready:
            i = pending.pop(ref)
            try:
                results[i] = get(ref, calls[i][1], calls[i][2])
            except (WorkerError, WaitTimeout) as exc:
                if not replaceable(i):
                    raise
                failed[i] = _dropped(exc)
                ray.kill(processes[i][0].process, no_restart=True)
                blamed(failed[i])
    return results, failed


def await_calls(
    calls: list[Call], deadline: Deadline, replaceable: frozenset[ReplicaId], together: bool = False
) -> tuple[list[Any], dict[int, Dropped]]:
    """Each call's result, or None for a call of a `replaceable` replica that raised, died or is still
    running at the deadline (hung), with when and why; any other failure raises, as `wait_all` does.
    `together`: a worker's replicas fail together (the ranks of a group): once one fails, the others'
    calls are given up at once; a replica whose process falls silent (`deadline.watch`) fails then."""
    results: list[Any] = [None] * len(calls)
    failed: dict[int, Dropped] = {}
    pending = {ref: i for i, (ref, _, _) in enumerate(calls)}

    def fail(i: int, dropped: Dropped) -> None:
        failed[i] = dropped
        pending.pop(calls[i][0], None)
        if together:
            for ref, j in list(pending.items()):
                if calls[j][1].worker == calls[i][1].worker:  # the replica's own other calls fail as it did
                    same = calls[j][1].id == calls[i][1].id
                    failed[j] = (
                        dropped if same else Dropped(time.time(), f"{calls[j][1].id} given up with {calls[i][1].id}")
                    )
                    del pending[ref]

    while pending:
        ready, silent = next_ready(list(pending), deadline, lambda ref: calls[pending[ref]][1])
        if silent:
            out = [i for i in pending.values() if calls[i][1].id in silent]
            if any(calls[i][1].id not in replaceable for i in out):
                raise silent_timeout(silent, deadline, tuple(calls[i][1] for i in out))
            for i in out:
                if calls[i][0] in pending:  # not given up with another already
                    one = {calls[i][1].id: silent[calls[i][1].id]}
                    fail(i, Dropped(time.time(), str(silent_timeout(one, deadline))))
            continue
        if not ready:
            if any(calls[i][1].id not in replaceable for i in pending.values()):
                wait_all([calls[i] for i in pending.values()], deadline)  # raises the usual timeout, naming them
            for i in pending.values():
                failed[i] = Dropped(time.time(), _still(calls[i], deadline))
            break
        i = pending.pop(ready[0])
        try:
            results[i] = get(ready[0], calls[i][1], calls[i][2])
        except (WorkerError, WaitTimeout) as exc:
            if calls[i][1].id not in replaceable:
                raise
            fail(i, _dropped(exc))
    return results, failed


def await_transfer(
    calls: list[Call],
    deadline: Deadline,
    destination: PortRef,
    replaceable: frozenset[ReplicaId],
    where_out: Callable[[list[int]], str] = lambda out: "",
) -> tuple[list[Any], dict[int, Dropped]]:
    """A sync edge's transfer, once its source has published: each destination replica's copy (its port
    `destination` called with what it received) and the source's send, if the transport has one (a
    broadcast). Returns the results (None for a call that failed) and the destination replicas to replace,
    each with when and why: those that failed of their own (their process died, their port raised, or they
    are still out at the deadline when the source is done), and with them those whose transfer a lost
    member broke (their step raised, or they still wait in it a tenth of the deadline after such a break).
    The source's process dying, a broken transfer that no destination's own failure explains, a hang while
    the source still sends, and any failure of a replica that may not be replaced raise, as `wait_all`
    does. A hang says where the calls still `out` are (`where_out`: the transfer's group, rank by rank)."""
    import ray

    results: list[Any] = [None] * len(calls)
    own: dict[int, Dropped] = {}  # destinations that failed of their own
    broken: dict[int, Exception] = {}  # transfer steps that raised, on either side: a member of the group was lost
    pending = {ref: i for i, (ref, _, _) in enumerate(calls)}
    breaks_at: float | None = None  # when destinations still waiting in a broken transfer are given up (once
    # a destination failed of its own: Ray may report a death after the broken steps it caused)
    timed_out = False

    def receiving() -> list[int]:
        return [i for i in pending.values() if calls[i][1].worker == destination.worker]

    while receiving() or (pending and not own):  # once a destination failed, the source's send is its loss
        grace = breaks_at is not None and own
        wait_s = min(deadline.left(), breaks_at - time.monotonic()) if grace else deadline.left()
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, wait_s))
        if not ready:
            timed_out = True  # the deadline passed, or the grace of a destination that failed (then `own`)
            break
        i = pending.pop(ready[0])
        replica = calls[i][1]
        try:
            results[i] = get(ready[0], replica, calls[i][2])
        except (WorkerError, WaitTimeout) as exc:
            stepped = isinstance(exc, PortFailed) and exc.port != destination.port  # its transport step raised
            if stepped:
                broken[i] = exc
                breaks_at = breaks_at or time.monotonic() + 0.1 * deadline.seconds
            elif replica.worker == destination.worker and replica.id in replaceable:
                own[i] = _dropped(exc)
            else:
                raise
    stuck = receiving()
    if timed_out and not own and not broken:  # a hang that no failure explains
        out = list(pending.values())
        if len(stuck) < len(out) or any(calls[i][1].id not in replaceable for i in stuck):
            try:
                wait_all([calls[i] for i in out], deadline)  # the source too: raises, naming them all
            except WaitTimeout as exc:
                raise exc.detailed(where_out(out)) from None
        seen, where = time.time(), where_out(out)
        own = {i: Dropped(seen, f"{_still(calls[i], deadline)} {where}".rstrip()) for i in stuck}  # the source is done
        stuck = []
    lost = [i for i in [*broken, *stuck] if calls[i][1].worker == destination.worker]
    if broken and not own:
        raise next(iter(broken.values()))
    kept = ", ".join(str(calls[i][1].id) for i in lost if calls[i][1].id not in replaceable)
    if kept:
        first = min(own.values(), key=lambda dropped: dropped.at)
        raise WorkerError(
            f"{first.why}; its transfer's group cannot meet again without {kept}, which is not replaceable"
        )
    seen = time.time()
    return results, own | {
        i: Dropped(seen, f"{calls[i][1].id} lost with the transfer a failed member broke") for i in lost
    }


def _still(call: Call, deadline: Deadline) -> str:
    """Why a call still out at its deadline failed: it hangs."""
    return f"{call[1].id} still in {call[2]} after {deadline.seconds:g}s"


def _alone(call: Call, alone_s: float) -> str:
    """Why a simulator's loop still out after its peers finished theirs failed: it hangs."""
    return f"{call[1].id} still in {call[2]} {alone_s:g}s after its peers finished theirs"


def _dropped(exc: WorkerError | WaitTimeout) -> Dropped:
    """A replica's own failure, seen now: the env it named, or the peer it stopped for."""
    env = exc.env if isinstance(exc, PortFailed) else None
    return Dropped(time.time(), headline(exc), env, exc.peer if isinstance(exc, PeerLost) else None)


def _own_failure(ref: Any, call: Call) -> Dropped | None:
    """The failure a process already raised itself (None: it has not, or it has not finished)."""
    if not finished(ref):
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
