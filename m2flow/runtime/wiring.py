"""The interaction loop's worker-to-worker channels: who sends to whom, each mailbox's address; wired
when a plan starts and again for a replica replaced in place (its peers drop the old channels)."""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from m2flow.graph import MacroGraph
from m2flow.runtime.waits import Deadline, wait_all
from m2flow.schedule import Plan, ReplicaId
from m2flow.sharding import owner

if TYPE_CHECKING:
    from m2flow.runtime.replica import Replica


class LoopChannels:
    def __init__(self, graph: MacroGraph, plan: Plan, start_s: float):
        self.graph, self.plan, self.start_s = graph, plan, start_s
        self.authkey = secrets.token_bytes(16)
        self.addresses: dict[ReplicaId, dict[str, Any]] = {}
        self.senders: dict[ReplicaId, set[ReplicaId]] = {}  # replica -> the replicas it sends to
        ports = graph.loop.ports
        for j in range(1, len(ports)):
            self._link(ports[j - 1].worker, ports[j].worker)
        self._link(ports[-1].worker, ports[1].worker)

    def wire(self, members: list[Replica]) -> None:
        """Open a mailbox on every loop replica and connect each to the peers it sends to."""
        self.addresses = self._open(members)
        replica_of = {r.id: r for r in members}
        calls = [
            (
                r.actor.connect.remote(self._addresses(r, self.senders.get(r.id, ()), replica_of), self.start_s),
                r,
                "connect channels",
            )
            for r in members
        ]
        wait_all(calls, Deadline(self.start_s, "channels to connect"))
        calls = [
            (r.actor.await_peers.remote(self._senders_to(r.id), self.start_s), r, "accept channels") for r in members
        ]
        wait_all(calls, Deadline(self.start_s, "channels to be accepted"))

    def rewire(self, new: list[Replica], replica_of: dict[ReplicaId, Replica]) -> None:
        """The channels of replaced replicas (new processes, any of them peers of each other): their other
        peers drop the old channels, then every channel with a new end connects afresh."""
        self.addresses.update(self._open(new))
        fresh = {r.id for r in new}
        links = {(sender, r.id) for r in new for sender in self._senders_to(r.id)}
        links |= {(r.id, receiver) for r in new for receiver in self.senders.get(r.id, ())}
        calls = [
            (replica_of[kept].actor.forget_peer.remote(gone), replica_of[kept], "forget a replaced peer")
            for link in links
            for kept, gone in (link, link[::-1])
            if kept not in fresh and gone in fresh
        ]
        wait_all(calls, Deadline(self.start_s, f"peers of {', '.join(map(str, sorted(fresh)))} to drop old channels"))
        sends, receives = self._ends(links)
        senders = [replica_of[s] for s in sends]
        calls = [
            (r.actor.connect.remote(self._addresses(r, sends[r.id], replica_of), self.start_s), r, "connect channels")
            for r in senders
        ]
        wait_all(calls, Deadline(self.start_s, "channels of replaced replicas to connect"))
        calls = [
            (replica_of[r].actor.await_peers.remote(sorted(by), self.start_s), replica_of[r], "accept channels")
            for r, by in receives.items()
        ]
        wait_all(calls, Deadline(self.start_s, "channels of replaced replicas to be accepted"))

    @staticmethod
    def _ends(links: set[tuple[ReplicaId, ReplicaId]]) -> tuple[dict, dict]:
        """(sender -> its receivers, receiver -> its senders) of `links`."""
        sends: dict[ReplicaId, list[ReplicaId]] = {}
        receives: dict[ReplicaId, list[ReplicaId]] = {}
        for sender, receiver in sorted(links):
            sends.setdefault(sender, []).append(receiver)
            receives.setdefault(receiver, []).append(sender)
        return sends, receives

    def _open(self, members: list[Replica]) -> dict[ReplicaId, dict[str, Any]]:
        kinds = ["unix", "tcp"] if self.plan.cluster.nodes > 1 else ["unix"]
        calls = [(r.actor.open_channels.remote(self.authkey, kinds), r, "open channels") for r in members]
        opened = wait_all(calls, Deadline(self.start_s, "channels to open"))
        return dict(zip([r.id for r in members], opened, strict=True))

    def _addresses(
        self, sender: Replica, peers: Iterable[ReplicaId], replica_of: dict[ReplicaId, Replica]
    ) -> list[tuple[ReplicaId, Any]]:
        """Each peer's address as `sender` dials it: a Unix socket on its node, TCP across nodes (where each
        runs now: a replica replaced off a lost node runs away from its planned device)."""
        node = sender.device.node
        kind = {peer: "unix" if replica_of[peer].device.node == node else "tcp" for peer in peers}
        return [(peer, self.addresses[peer][kind[peer]]) for peer in sorted(kind)]

    def _senders_to(self, peer: ReplicaId) -> list[ReplicaId]:
        return sorted(sender for sender, peers in self.senders.items() if peer in peers)

    def _link(self, src: str, dst: str) -> None:
        """Replicas of `src` send to the replicas of `dst` that own the same shards."""
        if src == dst:
            return
        workers = self.graph.workers
        shards = workers[self.graph.loop.entry.worker].count
        for b in range(shards):
            a, z = owner(b, shards, workers[src].count), owner(b, shards, workers[dst].count)
            self.senders.setdefault(ReplicaId(src, a), set()).add(ReplicaId(dst, z))
