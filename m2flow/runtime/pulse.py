"""A worker process's signs of life, beaten by threads of its own, so a hang is told from work without waiting
out a deadline: a process stopped, or stuck in native code that holds the GIL, falls silent.

- In the loop (`Pulse`): the process tells every peer its replicas send to that it is alive, and how long
  its port call in progress has run (none: it sends or waits). A receiver takes a peer silent for
  `run.timeouts.silence_s` as hung, and one that beats from inside one call past the channel deadline too
  (hung in Python code, or just slow: the channel deadline, as without a beat).
- Always (`beat_while_alive`): the process touches its beat file, `<run>/pulse/<address>-<pid>`. The driver,
  waiting on a call (training, a hook, a sync), reads the age of the files of the processes on its host
  (`Watch`): one silent for `silence_s` is hung. Processes on other hosts are left to their deadlines.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from m2flow.runtime.channels import Mailbox
from m2flow.runtime.nodes import process_name

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


BEAT_FILE_EVERY_S = 0.5  # how often a worker process touches its beat file; run.timeouts.silence_s is >= 4x this
_beating: list[threading.Thread] = []  # this process's beat-file thread, once started


def beat_file(run_dir: str, address: str, pid: int) -> Path:
    return Path(run_dir) / "pulse" / process_name(address, pid)


def beat_while_alive(run_dir: str, address: str) -> None:
    """Touch this process's beat file (on the node at `address`) every `BEAT_FILE_EVERY_S` for as long as the
    process lives; once per process."""
    if _beating:
        return
    path = beat_file(run_dir, address, os.getpid())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()

    def touch() -> None:
        while True:
            with contextlib.suppress(OSError):
                os.utime(path)
            time.sleep(BEAT_FILE_EVERY_S)

    _beating.append(threading.Thread(target=touch, name="m2flow-beat-file", daemon=True))
    _beating[0].start()


@dataclass(frozen=True)
class Watch:
    """The beat files of the processes on the driver's host (by replica id, with their pids): a process that
    still runs but has not beaten for `silence_s` is hung."""

    files: Mapping[Any, tuple[Path, int]]
    silence_s: float

    def silent(self, replicas: list[Any]) -> dict[Any, float]:
        """The ids of those of `replicas` whose process is silent, with how long it has been."""
        now, out = time.time(), {}
        for replica in replicas:
            path, pid = self.files.get(replica.id, (None, 0))
            if path is None or not _runs(pid):  # elsewhere, or gone: a death is Ray's to report
                continue
            with contextlib.suppress(OSError):
                if (age := now - path.stat().st_mtime) > self.silence_s:
                    out[replica.id] = age
        return out


def _runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
