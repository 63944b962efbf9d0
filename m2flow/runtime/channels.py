"""Worker-to-worker channels for the micro flow: per-step data never passes through the driver.

Each worker replica listens on one address per channel kind; a peer connects once per run and the
connection carries every message from that peer, in program order. Same node: a Unix socket
(~0.03 ms a hop here); other nodes: TCP. Every receive has a deadline and names what it waits for.
"""

from __future__ import annotations

import os
import pickle
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

from m2flow.errors import WaitTimeout, WorkerError

PeerId = tuple[str, int]  # (worker, replica)


@dataclass(frozen=True)
class ChannelKind:
    """How to listen and what address family peers dial."""

    name: str
    family: str

    def listen(self, tag: str, authkey: bytes) -> Listener:
        if self.family == "AF_UNIX":
            path = os.path.join(tempfile.mkdtemp(prefix="m2f-"), f"{tag[:40]}.sock")
            return Listener(path, family="AF_UNIX", authkey=authkey)
        return Listener((node_ip(), 0), family="AF_INET", authkey=authkey)


CHANNEL_KINDS = {"unix": ChannelKind("unix", "AF_UNIX"), "tcp": ChannelKind("tcp", "AF_INET")}


def node_ip() -> str:
    """This node's address as other nodes see it (the interface Ray would use)."""
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except ImportError:
        pass
    return socket.gethostbyname(socket.gethostname())


class Mailbox:
    """One replica's channel endpoints: listeners accepting peers, inbound and outbound connections."""

    def __init__(self, me: PeerId, authkey: bytes, kinds: list[str]):
        self.me = me
        self.authkey = authkey
        self.inbound: dict[PeerId, Connection] = {}
        self.outbound: dict[PeerId, Connection] = {}
        self.sent_bytes = 0
        self._arrived = threading.Condition()
        self._listeners = {k: CHANNEL_KINDS[k].listen(f"{me[0]}-{me[1]}", authkey) for k in kinds}
        for listener in self._listeners.values():
            threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    @property
    def addresses(self) -> dict[str, Any]:
        return {kind: listener.address for kind, listener in self._listeners.items()}

    def _accept(self, listener: Listener) -> None:
        while True:
            try:
                conn = listener.accept()
                peer = tuple(conn.recv())
            except (OSError, EOFError):
                return
            with self._arrived:
                self.inbound[peer] = conn
                self._arrived.notify_all()

    def connect(self, peer: PeerId, address: Any, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                conn = Client(address, authkey=self.authkey)
                break
            except (ConnectionRefusedError, FileNotFoundError):
                if time.monotonic() > deadline:
                    raise WaitTimeout(f"{_name(self.me)}: could not connect to {_name(peer)} at {address}") from None
                time.sleep(0.05)
        conn.send(list(self.me))
        self.outbound[peer] = conn

    def wait_inbound(self, peers: list[PeerId], timeout_s: float) -> None:
        with self._arrived:
            ok = self._arrived.wait_for(lambda: all(p in self.inbound for p in peers), timeout=timeout_s)
        if not ok:
            missing = ", ".join(_name(p) for p in peers if p not in self.inbound)
            raise WaitTimeout(f"{_name(self.me)}: peers never connected within {timeout_s:g}s: {missing}")

    def forget(self, peer: PeerId) -> None:
        """Close both channels with `peer` (replaced by a new process that will connect afresh)."""
        with self._arrived:
            for conn in (self.inbound.pop(peer, None), self.outbound.pop(peer, None)):
                if conn is not None:
                    conn.close()

    def send(self, peer: PeerId, header: tuple, payload: Any) -> int:
        data = pickle.dumps((header, payload), protocol=pickle.HIGHEST_PROTOCOL)
        try:
            self.outbound[peer].send_bytes(data)
        except (BrokenPipeError, ConnectionResetError, OSError) as exc:
            raise WorkerError(
                f"{_name(self.me)}: channel to {_name(peer)} broke ({exc}); did {_name(peer)} die?"
            ) from None
        self.sent_bytes += len(data)
        return len(data)

    def recv(self, peer: PeerId, header: tuple, timeout_s: float, waiting_for: str) -> Any:
        conn = self.inbound[peer]
        if not conn.poll(timeout_s):
            raise WaitTimeout(
                f"{_name(self.me)}: no data from {_name(peer)} for {timeout_s:g}s while waiting for {waiting_for}"
                f" (step {header[0]}); is {_name(peer)} hung?"
                " If it is just slow, raise run.timeouts.safety_factor or set run.timeouts.channel_s"
            )
        try:
            got, payload = pickle.loads(conn.recv_bytes())
        except (EOFError, ConnectionResetError, OSError):
            raise WorkerError(
                f"{_name(self.me)}: {_name(peer)} closed its channel while we waited for {waiting_for}"
                " (it crashed or was killed)"
            ) from None
        if tuple(got) != tuple(header):
            raise RuntimeError(
                f"{_name(self.me)}: out-of-order message from {_name(peer)}: got {got}, expected {header}"
            )
        return payload


def _name(peer: PeerId) -> str:
    return f"{peer[0]}[{peer[1]}]"
