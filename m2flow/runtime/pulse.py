"""A loop process's pulse: while it runs the loop, a thread of its own tells every peer its replicas send to
that the process is alive, and how long the port call in progress has run (none: it sends or waits).

So a receiver tells three things apart without waiting out the channel deadline: a peer that works or
waits (it pulses), a peer stopped or stuck in native code that holds the GIL (it falls silent: hung after
`run.timeouts.silence_s`), and a peer that pulses from inside one call longer than the channel deadline
(hung in Python code, or just slow: the channel deadline, as without a pulse).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from m2flow.runtime.channels import Mailbox

PULSES_PER_SILENCE = 4  # pulses sent within the silence a peer may keep: one late is no failure


class Pulse:
    """The pulse of one process for its members' mailboxes, every `silence_s / PULSES_PER_SILENCE`."""

    def __init__(self, mailboxes: list[Mailbox], silence_s: float):
        self.mailboxes = mailboxes
        self.every_s = silence_s / PULSES_PER_SILENCE
        self._call_since: float | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="m2flow-pulse", daemon=True)

    @contextmanager
    def calling(self) -> Iterator[None]:
        """Mark a port call in progress: the pulses say for how long."""
        self._call_since = time.monotonic()
        try:
            yield
        finally:
            self._call_since = None

    def __enter__(self) -> Pulse:
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stopped.set()
        self._thread.join(timeout=max(1.0, 2 * self.every_s))

    def _run(self) -> None:
        while not self._stopped.wait(self.every_s):
            since = self._call_since
            in_call_s = None if since is None else time.monotonic() - since
            for mailbox in self.mailboxes:
                mailbox.beat(in_call_s)
