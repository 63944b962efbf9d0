"""A worker process's crash record: the fatal signal it died of (a segfault in a physics engine, an abort in a
renderer) and the env it was working on then, read after its death, so the crash counts against that env
(`quarantine.py`) as an `m2flow.EnvFailed` it raised would.

Each worker process keeps two files under `<run>/crashes/`: `<pid>.env`, 8 bytes mapped into its memory
holding the global env it works on now (`WorkerContext.working_on`; -1: none), whose page outlives the
process, and `<pid>.txt`, where faulthandler writes the fatal error and the stacks (instead of the worker's
log). A process killed from outside (SIGKILL: the OOM killer, an operator) writes no fatal error: its env is
not blamed.
"""

from __future__ import annotations

import faulthandler
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from m2flow.context import NO_ENV, set_env_note

FATAL = "Fatal Python error: "
_kept: list = []  # this process's open record: kept for its life


def record_here(run_dir: str) -> None:
    """Keep this worker process's crash record under `<run_dir>/crashes/` (once per process)."""
    if _kept:
        return
    folder = Path(run_dir) / "crashes"
    folder.mkdir(parents=True, exist_ok=True)
    pid = os.getpid()
    (folder / f"{pid}.env").write_bytes(struct.pack("q", NO_ENV))
    note = open(folder / f"{pid}.env", "r+b")  # noqa: SIM115 - mapped for the process's life
    marks = mmap.mmap(note.fileno(), 8)
    dump = open(folder / f"{pid}.txt", "w")  # noqa: SIM115 - open for faulthandler for the process's life
    faulthandler.enable(file=dump, all_threads=True)
    _kept.extend([note, marks, dump])
    set_env_note(lambda env: struct.pack_into("q", marks, 0, env))


@dataclass(frozen=True)
class Crash:
    """How a worker process died of its own: the fatal error, and the env it was working on, if any."""

    fatal: str  # e.g. "Segmentation fault"
    env: int | None
    dump: Path  # its stacks

    def __str__(self) -> str:
        on = f" while working on env {self.env}" if self.env is not None else ""
        return f"it crashed: {self.fatal}{on} (its stacks: {self.dump})"


def crashed(run_dir: str, pid: int) -> Crash | None:
    """How the worker process `pid` (on this host) crashed; None when it did not (it was killed from outside,
    or it is not a worker process of this run)."""
    folder = Path(run_dir) / "crashes"
    dump = folder / f"{pid}.txt"
    try:
        text = dump.read_text(errors="replace")
        (env,) = struct.unpack("q", (folder / f"{pid}.env").read_bytes()[:8])
    except (OSError, struct.error):
        return None
    fatal = next((line.removeprefix(FATAL) for line in text.splitlines() if line.startswith(FATAL)), None)
    if fatal is None:
        return None
    return Crash(fatal.strip(), None if env == NO_ENV else env, dump)
