"""Worker-to-worker channels for the micro flow: per-step data never passes through the driver.

Each worker replica listens on one address per channel kind; a peer connects once per run and the
connection carries every message from that peer, in program order. Same node: a Unix socket at an abstract
address, no file (~0.03 ms a hop here); other nodes: TCP. Every receive has a deadline and names what it waits for.

For as long as it is open, a replica's mailbox beats to every peer it sends to, from a thread of its own (a
few bytes every `BEAT_EVERY_S`), saying how long its port call in progress has run (none: it sends, waits
or works outside the loop). A receiver takes a peer that sends nothing at all, neither data nor a beat, for
`Patience.silent_s` as hung (its process stopped, or stuck in native code that holds the GIL), and one whose
beats say its call has run `Patience.call_s` too (hung in Python code, or just slow); a peer that beats
while it waits on others may keep a receiver waiting `Patience.most_s` in all.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import secrets
import select
import socket
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

from m2flow.errors import WaitTimeout, WorkerError
from m2flow.runtime import pulse

PeerId = tuple[str, int]  # (worker, replica)
BEAT = ("beat",)  # a beat's header: "alive"; its payload, the port of its call in progress and how long it has run
BEAT_EVERY_S = 0.5  # how often a mailbox beats; a silence bound is at least 4x this (run.timeouts.silence_s)


class Unsendable(TypeError):
    """A message pickle cannot write (a lock, an open file, a function of no module)."""


@dataclass(frozen=True)
class Patience:
    """How long a receive waits for its peer: `silent_s` with no word from it (data or beat), while its beats
    say one call of its has run up to `call_s`, and `most_s` in all."""

    silent_s: float
    call_s: float
    most_s: float

    def __post_init__(self):
        if not 0 < self.silent_s <= self.most_s or not 0 < self.call_s <= self.most_s:
            raise ValueError(
                f"patience needs 0 < silent_s <= most_s and 0 < call_s <= most_s, got {self.silent_s},"
                f" {self.call_s}, {self.most_s}"
            )

    @classmethod
    def fixed(cls, seconds: float) -> Patience:
        """One deadline, beats or not."""
        return cls(seconds, seconds, seconds)


@dataclass(frozen=True)
class Message:
    """A data message on a channel: its header (step, port, slice) and what it carries."""

    header: tuple
    payload: Any


@dataclass(frozen=True)
class ChannelKind:
    """How to listen and what address family peers dial."""

    name: str
    family: str

    def listen(self, tag: str, authkey: bytes) -> Listener:
        if self.family == "AF_UNIX":
            # an abstract address (Linux): no socket file, so none is left behind by a process that is killed
            address = f"\0m2flow-{tag[:40]}-{os.getpid()}-{secrets.token_hex(4)}"
            return Listener(address, family="AF_UNIX", authkey=authkey)
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

    def __init__(self, me: PeerId, authkey: bytes, kinds: list[str], beat_every_s: float = BEAT_EVERY_S):
        self.me = me
        self.authkey = authkey
        self.inbound: dict[PeerId, Connection] = {}
        self.outbound: dict[PeerId, Connection] = {}
        self._sending: dict[PeerId, threading.Lock] = {}  # one writer at a time per channel: data or a beat
        self.sent_bytes = 0
        self._arrived = threading.Condition()
        # a message `arrived` read before its `recv` (both are called by the loop's one thread only)
        self._early: dict[PeerId, Message] = {}
        self._closed = threading.Event()
        self._listeners = {k: CHANNEL_KINDS[k].listen(f"{me[0]}-{me[1]}", authkey) for k in kinds}
        for listener in self._listeners.values():
            threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        self._beat_every_s = beat_every_s
        self._beater = threading.Thread(target=self._beat_until_closed, name="m2flow-beat", daemon=True)
        self._beater.start()

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
        self._sending[peer] = threading.Lock()
        self.outbound[peer] = conn

    def wait_inbound(self, peers: list[PeerId], timeout_s: float) -> None:
        with self._arrived:
            ok = self._arrived.wait_for(lambda: all(p in self.inbound for p in peers), timeout=timeout_s)
        if not ok:
            missing = ", ".join(_name(p) for p in peers if p not in self.inbound)
            raise WaitTimeout(f"{_name(self.me)}: peers never connected within {timeout_s:g}s: {missing}")

    def forget(self, peer: PeerId) -> None:
        """Close both channels with `peer` (replaced by a new process that will connect afresh)."""
        self._early.pop(peer, None)
        with self._arrived, self._sending.pop(peer, None) or contextlib.nullcontext():
            for conn in (self.inbound.pop(peer, None), self.outbound.pop(peer, None)):
                if conn is not None:
                    conn.close()

    def send(self, peer: PeerId, header: tuple, payload: Any) -> int:
        try:
            data = pickle.dumps((header, payload), protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:  # what pickle raises for what it cannot
            raise Unsendable(f"it cannot be sent to another process ({type(exc).__name__}: {exc})") from None
        try:
            with self._sending[peer]:
                self.outbound[peer].send_bytes(data)
        except (BrokenPipeError, ConnectionResetError, OSError) as exc:
            raise WorkerError(
                f"{_name(self.me)}: channel to {_name(peer)} broke ({exc}); did {_name(peer)} die?"
            ) from None
        self.sent_bytes += len(data)
        return len(data)

    def arrived(self, peer: PeerId, header: tuple) -> bool:
        """Whether the message `header` from `peer` has begun to arrive (then it is read whole, as `recv` reads
        it); waits for none. A message read to see is kept for its `recv`; the beats read past are dropped (the
        next beat, within `BEAT_EVERY_S`, says as much); a channel that broke says no here and is reported by the
        `recv` that waits on it."""
        if peer not in self._early:
            conn = self.inbound.get(peer)
            try:
                while conn is not None and conn.poll(0):
                    got, payload = pickle.loads(conn.recv_bytes())
                    if tuple(got) != BEAT:
                        self._early[peer] = Message(tuple(got), payload)
                        break
            except (EOFError, OSError):
                return False
        early = self._early.get(peer)
        return early is not None and early.header == tuple(header)

    def recv(self, peer: PeerId, header: tuple, patience: Patience, waiting_for: str) -> Any:
        """The message `header` from `peer`; past `patience` (module doc) raises `WaitTimeout`. Beats are read
        while more are waiting, and only the newest is judged: those left unread since an earlier receive
        say nothing of now."""
        if peer in self._early:
            early = self._early.pop(peer)
            return self._in_order(peer, header, early.header, early.payload)
        conn = self.inbound[peer]
        start = heard = now = time.monotonic()
        call_began: float | None = None  # when the peer's call in progress began, as its newest beat says
        call_port = ""  # and which port it called
        while True:
            bounds = (heard + patience.silent_s, start + patience.most_s)
            until = min(bounds) if call_began is None else min(*bounds, call_began + patience.call_s)
            if now >= until:
                in_call = None if call_began is None else (call_port, now - call_began)
                raise self._timeout(peer, header, patience, now - heard, waiting_for, in_call)
            if conn.poll(max(0.0, until - now)):
                while True:
                    got, payload = self._read(conn, peer, waiting_for)
                    if tuple(got) != BEAT:
                        return self._in_order(peer, header, got, payload)
                    heard = time.monotonic()
                    call_port, call_began = ("", None) if payload is None else (payload[0], heard - payload[1])
                    if not conn.poll(0):
                        break
            now = time.monotonic()

    def _in_order(self, peer: PeerId, header: tuple, got: tuple, payload: Any) -> Any:
        if tuple(got) != tuple(header):
            raise RuntimeError(
                f"{_name(self.me)}: out-of-order message from {_name(peer)}: got {got}, expected {header}"
            )
        return payload

    def _read(self, conn: Connection, peer: PeerId, waiting_for: str) -> tuple[tuple, Any]:
        try:
            return pickle.loads(conn.recv_bytes())
        except (EOFError, ConnectionResetError, OSError):
            raise WorkerError(
                f"{_name(self.me)}: {_name(peer)} closed its channel while we waited for {waiting_for}"
                " (it crashed or was killed)"
            ) from None

    def beat(self) -> None:
        """Tell every peer this replica sends to that it is alive, and which call its process is in and for how long
        (`pulse.calling`).
        Never blocks: a channel busy with data (that says more) or full (its reader stopped) goes without;
        a broken channel is the data's to report."""
        data = pickle.dumps((BEAT, pulse.current_call()), pickle.HIGHEST_PROTOCOL)
        for peer, conn in list(self.outbound.items()):
            lock = self._sending.get(peer)
            if lock is None or not lock.acquire(blocking=False):
                continue
            try:
                with contextlib.suppress(OSError, ValueError, TypeError):  # closed meanwhile
                    if _writable(conn):
                        conn.send_bytes(data)
            finally:
                lock.release()

    def _beat_until_closed(self) -> None:
        while not self._closed.wait(self._beat_every_s):
            try:
                self.beat()
            except Exception:  # noqa: BLE001 - a beat missed is no failure; a beat thread gone would be
                if not self._closed.is_set():  # one cut short by `close` is expected
                    logging.getLogger(__name__).exception("m2flow: %s could not beat", _name(self.me))

    def close(self) -> None:
        """Stop beating (a beat under way ends first, within a beat's interval) and listening, and close every
        channel."""
        self._closed.set()
        if self._beater is not threading.current_thread():
            self._beater.join(timeout=2 * self._beat_every_s)
        for listener in self._listeners.values():
            listener.close()
        for conn in [*self.inbound.values(), *self.outbound.values()]:
            conn.close()

    def _timeout(
        self,
        peer: PeerId,
        header: tuple,
        patience: Patience,
        silent: float,
        waiting_for: str,
        in_call: tuple[str, float] | None,
    ) -> WaitTimeout:
        """`in_call`: the port the peer is calling, as its newest beat says, and for how long."""
        if silent >= patience.silent_s:
            what = (
                f"no word from {_name(peer)} for {patience.silent_s:g}s (no data, no beat: its process is stopped,"
                " or stuck in native code that holds the GIL)"
            )
        elif in_call is not None and in_call[1] >= patience.call_s:
            what = f"{_name(peer)} has been in one call of {in_call[0]} for {in_call[1]:.1f}s, the most it may take"
        else:
            what = f"no data from {_name(peer)} for {patience.most_s:g}s, the most we may wait" + (
                "" if in_call is None else f" (it has been in one call of {in_call[0]} for {in_call[1]:.1f}s)"
            )
        return WaitTimeout(
            f"{_name(self.me)}: {what} while waiting for {waiting_for} (step {header[0]}); is {_name(peer)} hung?"
            " If it is just slow, raise run.timeouts.safety_factor or set run.timeouts.channel_s (a call that holds"
            " the GIL that long: run.timeouts.silence_s)"
        )


def _writable(conn: Connection) -> bool:
    """Whether a beat can be written to `conn` now, without blocking."""
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLOUT)
    return bool(poller.poll(0))


def _name(peer: PeerId) -> str:
    return f"{peer[0]}[{peer[1]}]"
