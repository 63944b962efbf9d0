"""Waits on calls of which replaceable replicas may fail: each one's failure, seen as it happens, comes back
with when and why (`Dropped`) for the caller to replace it, where `waits.wait_all` would raise. The loop's
calls (`await_loop`: a replica that died, hangs or was dropped by its peers), any phase's (`await_calls`)
and a weight sync's transfers (`await_transfer`: a destination's own failure told from the source's).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from m2flow.errors import WaitTimeout, WorkerError
from m2flow.runtime.host import PortFailed, headline
from m2flow.runtime.loop import Dropped, LoopStats, PeerLost
from m2flow.runtime.replica import Replica
from m2flow.runtime.waits import Deadline, finished, get, next_ready, silent_timeout, wait_all
from m2flow.schedule import ReplicaId
from m2flow.spec import PortRef

Call = tuple[Any, Replica, str]  # (the event's object reference, the replica called, what the call does)


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
            alone = Deadline(alone_s, "simulators whose peers finished the loop", naming=deadline.naming)
        waiting = deadline if alone is None or alone.left() > deadline.left() else alone
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, waiting.left()))
        if not ready:
            hung = list(pending.values())
            if len(hung) == len(calls) or not all(replaceable(i) for i in hung):  # none done: the loop is slow
                wait_all([calls[i] for i in hung], deadline)  # raises the usual timeout, naming them
            for i in hung:  # no peer waits on them (their part was done, its result stuck on its way): hung
                why = _still(calls[i], deadline) if waiting is deadline else _alone(calls[i], alone)
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
    """Why a call still out at its deadline failed: it hangs (in the call its process's beat file names)."""
    return f"{call[1].id} still in {call[2]}{_in_call(call, deadline)} after {deadline.seconds:g}s"


def _alone(call: Call, alone: Deadline) -> str:
    """Why a simulator's loop still out after its peers finished theirs failed: it hangs."""
    return f"{call[1].id} still in {call[2]}{_in_call(call, alone)} {alone.seconds:g}s after its peers finished theirs"


def _in_call(call: Call, deadline: Deadline) -> str:
    in_call = deadline.in_call(call[1].id)
    return f" ({in_call})" if in_call else ""


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
