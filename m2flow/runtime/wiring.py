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
    from m2flow.runtime.launch import Replica


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
        calls = [
            (
                r.actor.connect.remote(self._addresses(r, self.senders.get(r.id, ())), self.start_s),
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

    def rewire(self, new: Replica, replica_of: dict[ReplicaId, Replica]) -> None:
        """The channels of a replaced replica: its peers drop the old ones and connect to the new process."""
        self.addresses.update(self._open([new]))
        upstream = [replica_of[p] for p in self._senders_to(new.id)]
        downstream = [replica_of[p] for p in sorted(self.senders.get(new.id, ()))]
        peers = {p.id: p for p in upstream + downstream}.values()
        calls = [(p.actor.forget_peer.remote(new.id), p, "forget a replaced peer") for p in peers]
        wait_all(calls, Deadline(self.start_s, f"peers of {new.id} to drop its old channels"))
        calls = [
            (p.actor.connect.remote(self._addresses(p, [new.id]), self.start_s), p, "connect channels")
            for p in upstream
        ]
        mine = self._addresses(new, [p.id for p in downstream])
        calls.append((new.actor.connect.remote(mine, self.start_s), new, "connect channels"))
        wait_all(calls, Deadline(self.start_s, f"channels of {new.id} to connect"))
        calls = [(p.actor.await_peers.remote([new.id], self.start_s), p, "accept channels") for p in downstream]
        calls.append((new.actor.await_peers.remote([p.id for p in upstream], self.start_s), new, "accept channels"))
        wait_all(calls, Deadline(self.start_s, f"channels of {new.id} to be accepted"))

    def _open(self, members: list[Replica]) -> dict[ReplicaId, dict[str, Any]]:
        kinds = ["unix", "tcp"] if self.plan.cluster.nodes > 1 else ["unix"]
        calls = [(r.actor.open_channels.remote(self.authkey, kinds), r, "open channels") for r in members]
        opened = wait_all(calls, Deadline(self.start_s, "channels to open"))
        return dict(zip([r.id for r in members], opened, strict=True))

    def _addresses(self, sender: Replica, peers: Iterable[ReplicaId]) -> list[tuple[ReplicaId, Any]]:
        """Each peer's address as `sender` dials it: a Unix socket on its node, TCP across nodes."""
        node = sender.device.node
        kind = {peer: "unix" if self.plan.device_of(peer).node == node else "tcp" for peer in peers}
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
