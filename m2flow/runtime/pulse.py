"""A worker process's beat file: a thread of its own touches `<run>/pulse/<address>-<pid>` every
`BEAT_FILE_EVERY_S` for as long as the process lives, so the driver, waiting on a call of it (training, a
hook, a weight sync's publish), tells a process at work from one stopped, or stuck in native code that holds
the GIL, without waiting out the call's deadline: the second's file stops changing (`Watch`). The driver
reads the files of the processes on its own host; those on other hosts are left to their deadlines. (In the
loop, peers tell the same from the beats on their channels: `channels.py`.) While the process is in a loop
call (`calling`), its file says which port and since when, so a loop past its deadline names the call each
process still running is stuck in.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from m2flow.runtime.nodes import process_name
from m2flow.schedule import ReplicaId

BEAT_FILE_EVERY_S = 0.5  # how often a worker process touches its beat file; run.timeouts.silence_s is >= 4x this
_beating: list[threading.Thread] = []  # this process's beat-file thread, once started
_call: list[tuple[str, float] | None] = [None]  # the loop port this process is calling, since when (wall clock)


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
        said = None
        while True:
            with contextlib.suppress(OSError):
                if _call[0] != said:
                    said = _call[0]
                    written = path.with_name(f".{path.name}.tmp")
                    written.write_text("" if said is None else f"{said[0]} {said[1]}")
                    os.replace(written, path)  # whole: a reader never sees it half written
                else:
                    os.utime(path)
            time.sleep(BEAT_FILE_EVERY_S)

    _beating.append(threading.Thread(target=touch, name="m2flow-beat-file", daemon=True))
    _beating[0].start()


@contextlib.contextmanager
def calling(port: str) -> Iterator[None]:
    """This process is in a call of `port` ("worker.port") meanwhile: its beat file says so, and so do the beats of
    every replica it hosts on their channels (`channels.py`)."""
    _call[0] = (port, time.time())
    try:
        yield
    finally:
        _call[0] = None


def current_call() -> tuple[str, float] | None:
    """The loop port this process is calling and for how many seconds so far (`calling`), or None."""
    call = _call[0]
    return None if call is None else (call[0], time.time() - call[1])


@dataclass
class Watch:
    """The beat files of the processes on the driver's host (by replica, with their pids) during one wait:
    a process that still runs but whose file has not changed for `silence_s` of the driver's clock is hung
    (its file's time is only compared with itself: no clock of another machine is read)."""

    files: Mapping[ReplicaId, tuple[Path, int]]
    silence_s: float
    _seen: dict[ReplicaId, tuple[float, float]] = field(default_factory=dict)  # mtime, when it was first seen

    def silent(self, replicas: list[ReplicaId]) -> dict[ReplicaId, float]:
        """Those of `replicas` whose process is silent, with how long it has been, as far as this watch saw."""
        now, out = time.monotonic(), {}
        for replica in replicas:
            path, pid = self.files.get(replica, (None, 0))
            if path is None or not _runs(pid):  # elsewhere, or gone: a death is Ray's to report
                continue
            try:
                mtime = path.stat().st_mtime
            except OSError:
                continue
            seen, since = self._seen.get(replica, (None, now))
            if seen != mtime:
                self._seen[replica] = (mtime, now)
            elif now - since > self.silence_s:
                out[replica] = now - since
        return out

    def in_call(self, replica: ReplicaId) -> str:
        """What the beat file of `replica`'s process says of it: in a loop call ("in <port> for <seconds>"), or
        silent past `silence_s` ("no beat for <seconds> ...; last in <port>"); "" where it says neither, or is
        elsewhere."""
        path, _ = self.files.get(replica, (None, 0))
        try:
            said, silent_s = path.read_text().split(), time.time() - path.stat().st_mtime
            port, since = (said[0], float(said[1])) if len(said) == 2 else ("", 0.0)
        except (OSError, AttributeError, ValueError):  # no file here, or none readable
            return ""
        if silent_s > self.silence_s:
            stopped = f"no beat for {silent_s:.0f}s: stopped, or stuck in native code that holds the GIL"
            return stopped + (f"; last in {port}" if port else "")
        return f"in {port} for {time.time() - since:.0f}s" if port else ""


def _runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
