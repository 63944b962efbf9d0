"""The local program each replica runs for the interaction loop: receive, call the port, send on.

The batch is cut into `shards` (one per replica of the loop's first worker) and each shard into
`stages` slices. Every replica walks the same global order (step, port, slice), so the messages on
each channel arrive in the order they are awaited; with several slices, a worker computes slice s
while its peer already works on slice s+1 — pipelining falls out of the dataflow.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from m2flow.runtime.batching import concat, split
from m2flow.runtime.channels import Mailbox
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
    trace_steps: bool


@dataclass
class LoopStats:
    seconds: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    items: dict[str, int] = field(default_factory=dict)
    events: list[TaskEvent] = field(default_factory=list)
    sent_bytes: int = 0
    start: float = 0.0

    def add(
        self, port: str, start: float, end: float, items: int, step: int, stage: int, sent: int, trace: bool
    ) -> None:
        self.seconds[port] = self.seconds.get(port, 0.0) + end - start
        self.calls[port] = self.calls.get(port, 0) + 1
        self.items[port] = self.items.get(port, 0) + items
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
    here = {(m.worker, m.replica) for m in members}
    stats = {(m.worker, m.replica): LoopStats(start=time.time()) for m in members}
    sent_before = {(m.worker, m.replica): m.mailbox.sent_bytes for m in members}
    k = len(prog.ports) - 1
    local: dict[tuple, tuple[Any, list[int]]] = {}  # (worker, replica, port, slice) -> a member's own output
    inbox: dict[tuple, dict[int, Any]] = {}  # (to, from, step, port, slice) -> shards from a member here

    mine_of = {(m.worker, m.replica): shard_groups(prog.shards, prog.replicas[m.worker])[m.replica] for m in members}
    peers_of: dict[tuple, list[int]] = {}  # (worker, replica, upstream worker) -> upstream replicas it reads

    def shards(m: Member) -> list[int]:
        return mine_of[(m.worker, m.replica)]

    routes_of: dict[tuple, list[tuple[int, int]]] = {}  # (worker, replica, next worker) -> (shard, its replica)

    def routes(m: Member, w_next: str) -> list[tuple[int, int]]:
        key = (m.worker, m.replica, w_next)
        if key not in routes_of:
            routes_of[key] = [(b, owner(b, prog.shards, prog.replicas[w_next])) for b in shards(m)]
        return routes_of[key]

    def upstream_peers(m: Member, w_prev: str) -> list[int]:
        key = (m.worker, m.replica, w_prev)
        if key not in peers_of:
            peers_of[key] = sorted({owner(b, prog.shards, prog.replicas[w_prev]) for b in shards(m)})
        return peers_of[key]

    def deliver(m: Member, j_next: int, s: int, t_next: int, value: Any, sizes: list[int]) -> int:
        """Hand `value` to the next port's replicas; returns the bytes sent on channels."""
        w_next = prog.ports[j_next][0]
        if w_next == m.worker:
            local[(m.worker, m.replica, j_next, s)] = (value, sizes)
            return 0
        route = routes(m, w_next)
        parts = split(value, sizes) if len(route) > 1 else [value]
        by_peer: dict[int, dict[int, Any]] = {}
        for (shard, peer), part in zip(route, parts, strict=True):
            by_peer.setdefault(peer, {})[shard] = part
        sent = 0
        for peer, payload in by_peer.items():
            if (w_next, peer) in here:
                inbox.setdefault(((w_next, peer), (m.worker, m.replica), t_next, j_next, s), {}).update(payload)
            else:
                sent += m.mailbox.send((w_next, peer), (t_next, j_next, s), payload)
        return sent

    def gather(m: Member, j: int, s: int, t: int) -> tuple[Any, list[int]]:
        if (m.worker, m.replica, j, s) in local:
            return local.pop((m.worker, m.replica, j, s))
        upstream = 0 if (j == 1 and t == 0) else (k if j == 1 else j - 1)
        w_prev = prog.ports[upstream][0]
        mine = shards(m)
        pieces: dict[int, Any] = {}
        for peer in upstream_peers(m, w_prev):
            if (w_prev, peer) in here:  # produced earlier in this very program
                pieces.update(inbox.pop(((m.worker, m.replica), (w_prev, peer), t, j, s)))
                continue
            what = (
                f"{m.worker}.{prog.ports[j][1]} input from {w_prev}.{prog.ports[upstream][1]}"
                f" (iteration {prog.iteration})"
            )
            pieces.update(m.mailbox.recv((w_prev, peer), (t, j, s), prog.channel_timeout_s, what))
        return concat([pieces[b] for b in mine])

    def call(m: Member, j: int, s: int, value: Any, sizes: list[int], step: int, after: tuple[int, int] | None):
        """Call port j on slice s, then deliver its output to `after` = (next port, its step), if any."""
        port = prog.ports[j][1]
        start = time.time()
        out = m.call_port(port, s, value)
        end = time.time()
        sent = deliver(m, after[0], s, after[1], out, sizes) if after else 0
        items = sum(sizes) if value is not None else 0
        stats[(m.worker, m.replica)].add(port, start, end, items, step, s, sent, prog.trace_steps)

    for m in members:
        if prog.ports[0][0] == m.worker:
            for s in range(prog.stages):
                call(m, 0, s, None, [0], -1, (1, 0))
    for t in range(prog.horizon):
        for j in range(1, k + 1):
            for m in members:
                if prog.ports[j][0] != m.worker:
                    continue
                for s in range(prog.stages):
                    value, sizes = gather(m, j, s, t)
                    last = t == prog.horizon - 1 and j == k
                    call(m, j, s, value, sizes, t, None if last else (j + 1 if j < k else 1, t if j < k else t + 1))
    for m in members:
        key = (m.worker, m.replica)
        stats[key].sent_bytes = m.mailbox.sent_bytes - sent_before[key]
    return [stats[(m.worker, m.replica)] for m in members]
