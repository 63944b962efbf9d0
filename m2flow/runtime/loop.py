"""The local program each replica runs for the interaction loop: receive, call the port, send on.

The batch is cut into `shards` (one per replica of the loop's first worker) and each shard into
`stages` slices. Every replica walks the same global order (step, port, slice), so the messages on
each channel arrive in the order they are awaited; with several slices, a worker computes slice s
while its peer already works on slice s+1 — pipelining falls out of the dataflow. A port of
`merge_slices` (one whose call costs about the same for fewer rows, as a policy's on a GPU: the plan
says which) takes into its call of slice s the later slices of the same step whose inputs have all
arrived by then, and sends each slice's rows on as its own message: downstream, the messages are those of
slice-by-slice calls (their rows the same where the port is batch-invariant as declared).

A `droppable` replica of the first worker (a simulator) whose channel breaks or stays silent past its
deadline is dropped: its peers go on with the other shards and report it `lost`; the controller replaces
it and runs a program of `only_shards` to redo its part. Everyone else may then wait longer for its own
peers, since those may be waiting out a silent simulator first. Every replica's mailbox beats (`channels.py`):
a peer silent for `silence_s` is hung (stopped, or stuck holding the GIL), and so is one whose beats say one
call of its has run for a channel deadline. A droppable replica of another worker
(an inference replica) cannot be gone around: the simulators it serves stop with `PeerLost` naming it,
and the controller replaces it with them and redoes their shards.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from m2flow.errors import WaitTimeout, WorkerError
from m2flow.runtime import pulse
from m2flow.runtime.batching import BatchingError, concat, split
from m2flow.runtime.channels import Mailbox, Patience, PeerId, Unsendable
from m2flow.runtime.spans import Spans
from m2flow.runtime.tracing import TaskEvent
from m2flow.sharding import owner, shard_groups


@dataclass(frozen=True)
class LoopProgram:
    ports: tuple[tuple[str, str], ...]
    horizon: int
    stages: int
    shards: int
    replicas: dict[str, int]
    iteration: int
    channel_timeout_s: float
    silence_s: float  # a peer that sends nothing, neither data nor a beat, this long is hung (channels.py)
    trace_steps: bool
    droppable: frozenset[PeerId] = frozenset()  # replicas whose failure is not fatal (module doc)
    only_shards: tuple[int, ...] | None = None  # a redo: only these shards step
    merge_slices: frozenset[int] = frozenset()  # ports (by index) whose calls take in the later slices arrived


@dataclass(frozen=True)
class Slice:
    """A slice's data at a port: its rows (`value`, batch first), the shards they come from, in order, and the
    rows of each."""

    value: Any
    shards: tuple[int, ...]
    sizes: tuple[int, ...]

    @property
    def rows(self) -> int:
        return sum(self.sizes)


class Target(NamedTuple):
    """Where a port's output goes: the port (by index) and step whose input it is."""

    port: int
    step: int


@dataclass(frozen=True)
class Dropped:
    """A replica that failed in the loop: when, and why."""

    at: float  # time.time()
    why: str
    env: int | None = None  # the env that failed: named by the replica (`m2flow.EnvFailed`) or its crash record
    peer: PeerId | None = None  # the droppable peer it stopped for (`PeerLost`), if it did


class PeerLost(WorkerError):
    """A loop member stopped because `peer`, a droppable replica it cannot go on without, failed its channel."""

    def __init__(self, message: str, peer: PeerId):
        super().__init__(message)
        self.peer = peer

    def __reduce__(self):
        return (PeerLost, (self.args[0], self.peer))


@dataclass
class LoopStats:
    seconds: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    items: dict[str, int] = field(default_factory=dict)
    events: list[TaskEvent] = field(default_factory=list)
    spans: Spans = field(default_factory=Spans)  # when this process worked, for its device's busy time
    sent_bytes: int = 0
    start: float = 0.0
    lost: dict[int, Dropped] = field(default_factory=dict)  # by first-worker replica

    def add(
        self, port: str, start: float, end: float, items: int, step: int, stage: int, sent: int, trace: bool
    ) -> None:
        self.seconds[port] = self.seconds.get(port, 0.0) + end - start
        self.calls[port] = self.calls.get(port, 0) + 1
        self.items[port] = self.items.get(port, 0) + items
        self.spans.add(start, end)
        if trace:
            self.events.append(TaskEvent(port, "loop", start, end, step, stage, items, sent))


CallPort = Callable[[str, int, Any], Any]  # (port, slice, input or None) -> output


@dataclass(frozen=True)
class Member:
    """One worker replica this process runs the loop for."""

    worker: str
    replica: int
    call_port: CallPort
    mailbox: Mailbox


def run_loop(prog: LoopProgram, members: list[Member]) -> list[LoopStats]:
    """Run the loop for every member hosted in this process, in the global (step, port, slice) order.

    Messages between members of this process are handed over in memory (a direct call: no pickling,
    no channel, no wake-up); the rest go over the members' channels. Each member's own order is the
    global order restricted to it, as in a process of its own, so peers elsewhere see no difference.
    """
    return _LoopRun(prog, members).run()


class _LoopRun:
    """One iteration's loop in one process: its members, the messages in flight between them, their stats."""

    def __init__(self, prog: LoopProgram, members: list[Member]):
        self.prog, self.members = prog, members
        self.last_port = len(prog.ports) - 1
        self.here = {(m.worker, m.replica) for m in members}
        self.stats = {(m.worker, m.replica): LoopStats(start=time.time()) for m in members}
        self.sent_before = {(m.worker, m.replica): m.mailbox.sent_bytes for m in members}
        self.local: dict[tuple, Slice] = {}  # (worker, replica, port, slice) -> its own output
        self.inbox: dict[tuple, dict[int, Any]] = {}  # (to, from, step, port, slice) -> shards from a member here
        only = set(range(prog.shards) if prog.only_shards is None else prog.only_shards)
        self.mine = {
            (m.worker, m.replica): [
                b for b in shard_groups(prog.shards, prog.replicas[m.worker])[m.replica] if b in only
            ]
            for m in members
        }
        self._peers: dict[tuple, list[int]] = {}

    def run(self) -> list[LoopStats]:
        self._steps()
        for m in self.members:
            key = (m.worker, m.replica)
            self.stats[key].sent_bytes = m.mailbox.sent_bytes - self.sent_before[key]
        return [self.stats[(m.worker, m.replica)] for m in self.members]

    def _steps(self) -> None:
        """The entry port once per slice (the first observations), then `horizon` steps of the body ports."""
        prog = self.prog
        for m in self._members_of(0):
            shards = tuple(self.mine[(m.worker, m.replica)])
            for s in range(prog.stages):
                self.call(m, 0, s, [Slice(None, shards, (0,) * len(shards))], -1, Target(1, 0))
        for t in range(prog.horizon):
            for j in range(1, self.last_port + 1):
                for m in self._members_of(j):
                    s = 0
                    while s < prog.stages:
                        taken = [self.gather(m, j, s, t)]
                        if not taken[0].shards:  # every shard it served was dropped
                            s += 1
                            continue
                        while j in prog.merge_slices and self.arrived(m, j, s + len(taken), t):
                            taken.append(self.gather(m, j, s + len(taken), t))
                        self.call(m, j, s, taken, t, self._feeds(j, t))
                        s += len(taken)

    def _feeds(self, j: int, t: int) -> Target | None:
        """Where port j's output at step t goes: the next port of the step, the first body port of the next
        step, or nowhere after the last step."""
        if j < self.last_port:
            return Target(j + 1, t)
        return None if t == self.prog.horizon - 1 else Target(1, t + 1)

    def _upstream(self, j: int, t: int) -> int:
        """The port whose output is port j's input at step t: the entry's first observations, the last port of
        the step before, or the port before j."""
        if j == 1:
            return 0 if t == 0 else self.last_port
        return j - 1

    def _members_of(self, j: int) -> list[Member]:
        """The members here that run port j: those left with shards to serve."""
        return [m for m in self.members if m.worker == self.prog.ports[j][0] and self.mine[(m.worker, m.replica)]]

    def _patience(self, peer: PeerId) -> Patience:
        """How long to wait for `peer`'s message: silent for the silence bound, or in one call for a channel
        deadline, it is hung; a droppable simulator replica may take a channel deadline in all, any other peer
        may also wait out each droppable simulator replica before it (in turn)."""
        channel_s, silent_s = self.prog.channel_timeout_s, self.prog.silence_s
        entry = self.prog.ports[0][0]
        simulators = sum(1 for worker, _ in self.prog.droppable if worker == entry)
        if peer[0] == entry and peer in self.prog.droppable:
            return Patience(silent_s, channel_s, channel_s)
        return Patience(silent_s, channel_s, channel_s * (1 + simulators))

    def drop(self, m: Member, peer: PeerId, error: Exception) -> None:
        """Go on without `peer`, a droppable simulator replica that failed `m`'s channel: its shards leave
        every member here. Raises when `m` cannot go on: `PeerLost` if `peer` may be replaced (an inference
        replica the simulators it serves wait on), the error itself if its failure is fatal."""
        entry = self.prog.ports[0][0]
        if peer not in self.prog.droppable:
            raise error
        if m.worker == entry or peer[0] != entry:
            raise PeerLost(str(error), peer) from None
        gone = set(shard_groups(self.prog.shards, self.prog.replicas[entry])[peer[1]])
        for key, shards in self.mine.items():
            self.mine[key] = [b for b in shards if b not in gone]
        self._peers.clear()
        self.stats[(m.worker, m.replica)].lost[peer[1]] = Dropped(time.time(), str(error).splitlines()[0])

    def upstream_peers(self, m: Member, w_prev: str) -> list[int]:
        """The replicas of `w_prev` that send `m` its shards."""
        key = (m.worker, m.replica, w_prev)
        if key not in self._peers:
            owned = self.mine[(m.worker, m.replica)]
            self._peers[key] = sorted({owner(b, self.prog.shards, self.prog.replicas[w_prev]) for b in owned})
        return self._peers[key]

    def deliver(self, m: Member, j_next: int, s: int, t_next: int, value: Any, source: Slice) -> int:
        """Hand `value`, the output for `source`'s rows, to the next port's replicas: each shard's rows to the
        replica that owns it, but for shards dropped since they were gathered. Returns the bytes sent on channels."""
        w_next = self.prog.ports[j_next][0]
        if w_next == m.worker:
            self.local[(m.worker, m.replica, j_next, s)] = Slice(value, source.shards, source.sizes)
            return 0
        parts = split(value, list(source.sizes)) if len(source.shards) > 1 else [value]
        live = set(self.mine[(m.worker, m.replica)])
        by_peer: dict[int, dict[int, Any]] = {}
        for shard, part in zip(source.shards, parts, strict=True):
            if shard in live:
                by_peer.setdefault(owner(shard, self.prog.shards, self.prog.replicas[w_next]), {})[shard] = part
        sent = 0
        for peer, payload in by_peer.items():
            if (w_next, peer) in self.here:
                self.inbox.setdefault(((w_next, peer), (m.worker, m.replica), t_next, j_next, s), {}).update(payload)
                continue
            try:
                sent += m.mailbox.send((w_next, peer), (t_next, j_next, s), payload)
            except WorkerError as exc:
                self.drop(m, (w_next, peer), exc)
        return sent

    def gather(self, m: Member, j: int, s: int, t: int) -> Slice:
        """The input of port j, slice s, step t for `m`: its own output, or its shards from upstream."""
        if (m.worker, m.replica, j, s) in self.local:
            return self.local.pop((m.worker, m.replica, j, s))
        prog = self.prog
        upstream = self._upstream(j, t)
        w_prev = prog.ports[upstream][0]
        pieces: dict[int, Any] = {}
        for peer in self.upstream_peers(m, w_prev):
            if (w_prev, peer) in self.here:  # produced earlier in this very program
                pieces.update(self.inbox.pop(((m.worker, m.replica), (w_prev, peer), t, j, s)))
                continue
            port, source = prog.ports[j][1], prog.ports[upstream][1]
            what = f"{m.worker}.{port} input from {w_prev}.{source} (iteration {prog.iteration})"
            try:
                patience = self._patience((w_prev, peer))
                pieces.update(m.mailbox.recv((w_prev, peer), (t, j, s), patience, what))
            except (WorkerError, WaitTimeout) as exc:
                self.drop(m, (w_prev, peer), exc)
        shards = tuple(self.mine[(m.worker, m.replica)])
        if not shards:
            return Slice(None, (), ())
        try:
            value, sizes = concat([pieces[b] for b in shards])
        except BatchingError as exc:
            producer = ".".join(prog.ports[upstream])
            raise WorkerError(
                f"worker '{m.worker}' replica {m.replica}: the outputs of {producer} for its envs cannot be batched"
                f" into one call of port '{prog.ports[j][1]}' (iteration {prog.iteration}): {exc}"
            ) from None
        return Slice(value, shards, tuple(sizes))

    def _returned(self, m: Member, port: str, after: Target) -> str:
        """The start of a message on what `m`'s call of `port` returned for the next port, `after`."""
        consumer = ".".join(self.prog.ports[after.port])
        iteration = self.prog.iteration
        return f"worker '{m.worker}' replica {m.replica}: port '{port}' (iteration {iteration}) returned for {consumer}"

    def arrived(self, m: Member, j: int, s: int, t: int) -> bool:
        """Whether slice s of port j, step t, is a slice of this step whose every input for `m` is here already."""
        if s >= self.prog.stages or not self.mine[(m.worker, m.replica)]:
            return False
        w_prev = self.prog.ports[self._upstream(j, t)][0]
        return all(
            (w_prev, peer) in self.here or m.mailbox.arrived((w_prev, peer), (t, j, s))
            for peer in self.upstream_peers(m, w_prev)
        )

    def call(self, m: Member, j: int, s: int, taken: list[Slice], step: int, after: Target | None):
        """Call port j on slices s, s+1, ... (`taken`: several in one call), then deliver each slice's part of the
        output to `after`, if anywhere."""
        port = self.prog.ports[j][1]
        try:
            value = taken[0].value if len(taken) == 1 else concat([piece.value for piece in taken])[0]
        except BatchingError as exc:
            producer = ".".join(self.prog.ports[self._upstream(j, step)])
            raise WorkerError(
                f"worker '{m.worker}' replica {m.replica}: the outputs of {producer} for its slices cannot be merged"
                f" into one call of port '{port}' (iteration {self.prog.iteration}): {exc}"
            ) from None
        start = time.time()
        with pulse.calling(f"{m.worker}.{port}"):  # the process is in a call: every replica it hosts says so
            out = m.call_port(port, s, value)
        end = time.time()
        sent = 0
        if after:
            if out is None:
                raise WorkerError(
                    f"{self._returned(m, port, after)} None; return its output: numpy arrays or dicts of them"
                )
            try:
                parts = [out] if len(taken) == 1 else split(out, [piece.rows for piece in taken])
                for i, (piece, part) in enumerate(zip(taken, parts, strict=True)):
                    sent += self.deliver(m, after.port, s + i, after.step, part, piece)
            except (BatchingError, Unsendable) as exc:
                raise WorkerError(f"{self._returned(m, port, after)} what cannot be handed on: {exc}") from None
        items = sum(piece.rows for piece in taken) if value is not None else 0
        self.stats[(m.worker, m.replica)].add(port, start, end, items, step, s, sent, self.prog.trace_steps)
