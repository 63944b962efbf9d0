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

from m2flow.runtime.batching import concat, leading_size, split
from m2flow.runtime.channels import Mailbox
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
    events: list[tuple] = field(default_factory=list)
    sent_bytes: int = 0
    start: float = 0.0

    def add(
        self, port: str, start: float, end: float, items: int, step: int, stage: int, sent: int, trace: bool
    ) -> None:
        self.seconds[port] = self.seconds.get(port, 0.0) + end - start
        self.calls[port] = self.calls.get(port, 0) + 1
        self.items[port] = self.items.get(port, 0) + items
        if trace:
            self.events.append((port, "loop", start, end, step, stage, items, sent))


CallPort = Callable[[str, int, Any], Any]  # (port, slice, input or None) -> output


def run_loop(prog: LoopProgram, worker: str, replica: int, call_port: CallPort, mailbox: Mailbox) -> LoopStats:
    stats = LoopStats(start=time.time())
    sent_before = mailbox.sent_bytes
    k = len(prog.ports) - 1
    mine = shard_groups(prog.shards, prog.replicas[worker])[replica]
    local: dict[tuple[int, int], tuple[Any, list[int]]] = {}

    def deliver(j_next: int, s: int, t_next: int, value: Any, sizes: list[int]) -> int:
        """Hand `value` to the next port's replicas; returns the bytes sent on channels."""
        w_next = prog.ports[j_next][0]
        if w_next == worker:
            local[(j_next, s)] = (value, sizes)
            return 0
        parts = split(value, sizes) if len(mine) > 1 else [value]
        by_peer: dict[int, dict[int, Any]] = {}
        for shard, part in zip(mine, parts, strict=True):
            by_peer.setdefault(owner(shard, prog.shards, prog.replicas[w_next]), {})[shard] = part
        return sum(mailbox.send((w_next, peer), (t_next, j_next, s), payload) for peer, payload in by_peer.items())

    def gather(j: int, s: int, t: int) -> tuple[Any, list[int]]:
        if (j, s) in local:
            return local.pop((j, s))
        upstream = 0 if (j == 1 and t == 0) else (k if j == 1 else j - 1)
        w_prev = prog.ports[upstream][0]
        pieces: dict[int, Any] = {}
        for peer in sorted({owner(b, prog.shards, prog.replicas[w_prev]) for b in mine}):
            what = (
                f"{worker}.{prog.ports[j][1]} input from {w_prev}.{prog.ports[upstream][1]}"
                f" (iteration {prog.iteration})"
            )
            pieces.update(mailbox.recv((w_prev, peer), (t, j, s), prog.channel_timeout_s, what))
        return concat([pieces[b] for b in mine])

    def call(j: int, s: int, value: Any, sizes: list[int], step: int, after: tuple[int, int] | None) -> None:
        """Call port j on slice s, then deliver its output to `after` = (next port, its step), if any."""
        port = prog.ports[j][1]
        start = time.time()
        out = call_port(port, s, value)
        end = time.time()
        sent = deliver(after[0], s, after[1], out, sizes) if after else 0
        items = leading_size(value) if value is not None else 0
        stats.add(port, start, end, items, step, s, sent, prog.trace_steps)

    if prog.ports[0][0] == worker:
        for s in range(prog.stages):
            call(0, s, None, [0], -1, (1, 0))
    for t in range(prog.horizon):
        for j in range(1, k + 1):
            if prog.ports[j][0] != worker:
                continue
            for s in range(prog.stages):
                value, sizes = gather(j, s, t)
                last = t == prog.horizon - 1 and j == k
                call(j, s, value, sizes, t, None if last else (j + 1 if j < k else 1, t if j < k else t + 1))
    stats.sent_bytes = mailbox.sent_bytes - sent_before
    return stats
