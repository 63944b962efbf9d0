"""What a stuck worker is doing, asked when a wait on a process group's ranks passes its deadline.

Every worker process writes the Python stacks of its threads to `<run>/stacks/<address>-<pid>.txt` (its
node's address: hosts may share the folder) when it gets SIGUSR1 (faulthandler: it answers even while
blocked in a collective's C code). The controller signals
each rank of the stuck group and reads the answers: those on its own host itself, those on another host
through a task on that host's Ray node (`ask_on_node`; a host cut off does not answer in time). A rank
whose stack is in `torch.distributed` has arrived at a collective and waits for the others; one that
answers from anywhere else has not arrived (it says where it is); one that does not answer is stopped, or
hung outside Python.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

from m2flow.runtime.nodes import Unreached, process_name, run_on

ASK = signal.SIGUSR1
ANSWER_S = 2.0  # how long a rank is given to answer
SETTLED_S = 0.2  # an answer that has not grown for this long is whole (written at once by the signal handler)
REACH_S = 5.0  # how long another host is given to start the question there
_STDLIB = sysconfig.get_paths()["stdlib"] + os.sep
_INSTALLED = tuple({sysconfig.get_paths()[key] + os.sep for key in ("purelib", "platlib")})  # may lie under _STDLIB
_answers = []  # this process's open answer file: kept open for faulthandler while the process lives


def answer_when_asked(run_dir: str, address: str) -> None:
    """Make this worker process, on the node at `address`, write its stacks on SIGUSR1 (once per process)."""
    if _answers:
        return
    answer = _answer_file(run_dir, address, os.getpid())
    answer.parent.mkdir(parents=True, exist_ok=True)
    _answers.append(open(answer, "w"))  # noqa: SIM115 - open for the process's life
    faulthandler.register(ASK, file=_answers[0], all_threads=True)


@dataclass(frozen=True)
class RankState:
    rank: str  # the replica, e.g. "actor[1]"
    arrived: bool | None  # at a collective (None: it did not answer)
    where: str  # the collective and its caller, the frame it is in, or why it did not answer


@dataclass(frozen=True)
class _Question:
    """A rank asked: its answer file, and how long the file was before the question (what it says is after)."""

    answer: Path
    before: int


def ask(ranks: dict[str, int], run_dir: str, address: str) -> list[RankState]:
    """Where each rank (replica name -> pid on this host, the node at `address`) is now."""
    asked: dict[str, _Question] = {}
    for rank, pid in ranks.items():
        answer = _answer_file(run_dir, address, pid)
        question = _Question(answer, _size(answer))
        try:
            os.kill(pid, ASK)
        except ProcessLookupError:
            continue
        asked[rank] = question
    _await_answers(asked)
    states = []
    for rank in ranks:
        if rank not in asked:
            states.append(RankState(rank, None, "its process is gone"))
            continue
        answer, before = asked[rank].answer, asked[rank].before
        text = answer.read_bytes()[before:].decode(errors="replace") if answer.exists() else ""
        states.append(_state(rank, text))
    return states


def _await_answers(asked: dict[str, _Question]) -> None:
    """Until every rank's answer has grown and then not grown for `SETTLED_S`, or `ANSWER_S` passed: a rank stopped
    or hung outside Python never answers, and takes the whole wait."""
    deadline = time.monotonic() + ANSWER_S
    last: dict[str, int] = {}
    while time.monotonic() < deadline:
        now = {rank: _size(question.answer) for rank, question in asked.items()}
        if all(now[rank] > question.before and now[rank] == last.get(rank) for rank, question in asked.items()):
            return
        last = now
        time.sleep(SETTLED_S)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def ask_on_node(node: str, ranks: dict[str, tuple[int, float]], run_dir: str) -> list[RankState]:
    """Where each rank (replica name -> its pid and start time on Ray node `node`) is now, asked by a task
    on that node; ranks whose process is no longer the one started for them are not signalled. A node that
    does not run the task in time (cut off, gone) leaves its ranks unasked."""
    try:
        return run_on(node, _ask_here, ranks, run_dir, timeout_s=ANSWER_S + REACH_S)
    except Unreached as why:
        return [RankState(rank, None, f"{why}: not asked") for rank in ranks]


def _ask_here(ranks: dict[str, tuple[int, float]], run_dir: str) -> list[RankState]:
    """`ask` on this host, for the ranks whose pid still belongs to the process started for them."""
    import psutil
    import ray

    def same(pid: int, started: float) -> bool:
        try:
            return psutil.Process(pid).create_time() == started
        except psutil.Error:
            return False

    live = {rank: pid for rank, (pid, started) in ranks.items() if same(pid, started)}
    here = ray.util.get_node_ip_address()
    return ask(live, run_dir, here) + [
        RankState(rank, None, "its process is gone") for rank in ranks if rank not in live
    ]


def _answer_file(run_dir: str, address: str, pid: int) -> Path:
    return Path(run_dir) / "stacks" / f"{process_name(address, pid)}.txt"


def _state(rank: str, dump: str) -> RankState:
    """A rank's state from its faulthandler dump (empty: no answer): in a collective if one of its threads
    is; else where the thread running its current call (m2flow's host) is, and the first frame outside the
    standard library that called it there; a process running no call says so, and where its first thread is."""
    if not dump.strip():
        return RankState(rank, None, f"no answer within {ANSWER_S:g}s: stopped, or hung outside Python")
    threads = [_frames(block) for block in dump.split("\n\n") if "File " in block]
    for frames in threads:
        collective = next((i for i, f in enumerate(frames) if "torch/distributed" in f), None)
        if collective is not None:
            caller = next((f for f in frames[collective:] if "torch/" not in f), frames[collective])
            return RankState(rank, True, f"in {_short(frames[collective])}, called from {_short(caller)}")
    working = next((frames for frames in threads if any("m2flow/runtime/host.py" in f for f in frames)), None)
    frames = working or (threads[0] if threads else [])
    if not frames:
        return RankState(rank, False, "not in a collective: at an unknown frame")
    where = f"not in a collective: at {_short(frames[0])}"
    caller = next((f for f in frames if not _in_stdlib(f)), frames[0])  # a wait's own frames say little
    if caller != frames[0]:
        where += f", called from {_short(caller)}"
    return RankState(rank, False, where if working else f"{where} (running no call of its worker)")


def _in_stdlib(frame: str) -> bool:
    """Whether a dump's frame is in Python's standard library (a lock's or a condition's wait, say)."""
    path = frame.removeprefix('File "')
    return path.startswith(_STDLIB) and not path.startswith(_INSTALLED)


def _frames(thread: str) -> list[str]:
    """A thread's frames in a faulthandler dump, the most recent first."""
    return [line.strip() for line in thread.splitlines() if line.strip().startswith("File ")]


def _short(frame: str) -> str:
    """`File "/a/b/c.py", line 12 in f` -> `f (b/c.py:12)`."""
    try:
        path, rest = frame.removeprefix('File "').split('", line ', 1)
        line, func = rest.split(" in ", 1)
    except ValueError:
        return frame
    return f"{func} ({'/'.join(Path(path).parts[-2:])}:{line})"


def explain(group: str, states: list[RankState], finished: tuple[str, ...] = ()) -> str:
    """One line: which ranks of `group` arrived at a collective and which did not (`states`: the ranks still
    out; `finished`: those whose part is done, a weight sync's source that has sent, say)."""
    arrived = [s for s in states if s.arrived]
    missing = [s for s in states if not s.arrived]
    total = len(states) + len(finished)
    parts = [f"process group of '{group}': {len(arrived)} of {total} ranks in a collective"]
    if finished:
        parts.append("finished: " + ", ".join(finished))
    if arrived:
        parts.append("arrived: " + ", ".join(f"{s.rank} {s.where}" for s in arrived))
    if missing:
        parts.append("not arrived: " + ", ".join(f"{s.rank} {s.where}" for s in missing))
    return "; ".join(parts)
