"""A worker process's crash record: the fatal signal it died of (a segfault in a physics engine, an abort in a
renderer) and the env it was working on then, read after its death, so the crash counts against that env
(`quarantine.py`) as an `m2flow.EnvFailed` it raised would, and the failure says how the process died.

Each worker process keeps two files under `<run>/crashes/`, named by its node's address and its pid:
`<address>-<pid>.env`, 16 bytes mapped into its memory holding the global env it works on now and the
thread working on it (`WorkerContext.working_on`), whose page outlives the process, and
`<address>-<pid>.txt`, where faulthandler writes the fatal error and every thread's stacks (instead of the
worker's log). A crash counts against the env only when the thread that noted it is the one that crashed.
A process killed from outside (SIGKILL: the OOM killer, an operator) writes no fatal error and blames no
env, nor does a fatal error of the interpreter itself (it turns faulthandler off before it aborts).
"""

from __future__ import annotations

import faulthandler
import mmap
import os
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from m2flow.context import set_env_note
from m2flow.runtime.nodes import Unreached, addresses, process_name, run_on
from m2flow.schedule import ReplicaId

if TYPE_CHECKING:
    from m2flow.runtime.started import Started

FATAL = "Fatal Python error: "
NOTE_BYTES = 16  # two unsigned 64-bit words: the env plus one (0: none), the thread working on it
REACH_S = 5.0  # how long another host is given to read its records
_kept: list = []  # this process's open record: kept for its life


def record_here(run_dir: str, address: str) -> None:
    """Keep this worker process's crash record under `<run_dir>/crashes/` (once per process); `address` is
    its node's, which tells it from a process of the same pid on another host sharing the folder."""
    if _kept:
        return
    env_file, dump_file = _files(run_dir, address, os.getpid())
    env_file.parent.mkdir(parents=True, exist_ok=True)
    env_file.write_bytes(bytes(NOTE_BYTES))
    note = open(env_file, "r+b")  # noqa: SIM115 - mapped for the process's life
    marks = mmap.mmap(note.fileno(), NOTE_BYTES)
    slot = memoryview(marks).cast("Q")
    dump = open(dump_file, "w")  # noqa: SIM115 - open for faulthandler for the process's life
    faulthandler.enable(file=dump, all_threads=True)
    _kept.extend([note, marks, slot, dump])

    def note_env(env: int | None) -> None:
        slot[0], slot[1] = (0, 0) if env is None else (env + 1, threading.get_ident())

    set_env_note(note_env)


@dataclass(frozen=True)
class Crash:
    """How a worker process died of its own: the fatal error, and the env it was working on, if any."""

    fatal: str  # e.g. "Segmentation fault"
    env: int | None
    dump: Path  # its stacks

    def __str__(self) -> str:
        on = f" while working on env {self.env}" if self.env is not None else ""
        return f"it crashed: {self.fatal}{on} (its stacks: {self.dump})"


def crashed(run_dir: str, address: str, pid: int) -> Crash | None:
    """How the worker process `pid` on the node at `address` crashed, read on that node; None when it did
    not (it was killed from outside, or it is not a worker process of this run)."""
    env_file, dump = _files(run_dir, address, pid)
    try:
        text = dump.read_text(errors="replace")
        slot = memoryview(env_file.read_bytes()[:NOTE_BYTES]).cast("Q")
    except (OSError, TypeError, ValueError):
        return None
    fatal = next((line.removeprefix(FATAL) for line in text.splitlines() if line.startswith(FATAL)), None)
    if fatal is None:
        return None
    env, thread = slot[0] - 1, slot[1]
    crashing = re.search(r"^Current thread (0x[0-9a-f]+)", text, re.MULTILINE)
    noted_there = env >= 0 and crashing is not None and int(crashing.group(1), 16) == thread
    return Crash(fatal.strip(), env if noted_there else None, dump)


def crashed_on(node: str, processes: dict[str, tuple[str, int]], run_dir: str) -> dict[str, Crash | None]:
    """`crashed` for processes (name -> node address and pid) of Ray node `node`, read by a task there; a
    node that does not run it in time (gone, cut off) leaves them unread (None)."""
    try:
        return run_on(node, _read_here, processes, run_dir, timeout_s=REACH_S)
    except Unreached:
        return dict.fromkeys(processes)


def crashes_of(
    started: Mapping[ReplicaId, Started], run_dir: str, replicas: Iterable[ReplicaId]
) -> dict[ReplicaId, Crash]:
    """How the processes of these replicas (as `started` says: node and pid) that crashed of their own
    crashed, each record read on its node; one entry per process (replicas sharing one: the first)."""
    import ray

    where, me = addresses(), ray.util.get_node_ip_address()
    alive = {node["NodeID"] for node in ray.nodes() if node.get("Alive")}
    by_process: dict[tuple[str, int], ReplicaId] = {}
    for r in replicas:
        if started[r].node in alive:  # a node gone took its records with it
            by_process.setdefault((started[r].node, started[r].pid), r)
    found: dict[ReplicaId, Crash | None] = {}
    remote: dict[str, dict[str, tuple[str, int]]] = {}
    for (node, pid), r in by_process.items():
        address = where.get(node, "")
        if address == me:
            found[r] = crashed(run_dir, address, pid)
        else:
            remote.setdefault(node, {})[str(r)] = (address, pid)
    named = {str(r): r for r in by_process.values()}
    for node, processes in remote.items():
        found.update({named[name]: crash for name, crash in crashed_on(node, processes, run_dir).items()})
    return {r: crash for r, crash in found.items() if crash is not None}


def _read_here(processes: dict[str, tuple[str, int]], run_dir: str) -> dict[str, Crash | None]:
    return {name: crashed(run_dir, address, pid) for name, (address, pid) in processes.items()}


def _files(run_dir: str, address: str, pid: int) -> tuple[Path, Path]:
    """A process's env note and its fatal-error dump."""
    folder, name = Path(run_dir) / "crashes", process_name(address, pid)
    return folder / f"{name}.env", folder / f"{name}.txt"
