"""Asking a stuck process where it is: a real process answers with its stack, a stopped one does not."""

from __future__ import annotations

import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from m2flow.runtime import stacks
from m2flow.runtime.stacks import RankState, _state, ask, explain

ADDRESS = "10.0.0.1"  # the node the processes run on, as their answer files are named

WAITING = """
import sys, time
from m2flow.runtime.stacks import answer_when_asked
answer_when_asked(sys.argv[1], sys.argv[2])
def waiting_for_a_peer():
    print("ready", flush=True)
    time.sleep(60)
waiting_for_a_peer()
"""


def test_a_running_process_says_where_it_is_and_a_stopped_one_is_named_as_not_answering(tmp_path):
    procs = [
        subprocess.Popen([sys.executable, "-c", WAITING, str(tmp_path), ADDRESS], stdout=subprocess.PIPE) for _ in "ab"
    ]
    try:
        for proc in procs:
            assert proc.stdout.readline().strip() == b"ready"
        procs[1].send_signal(signal.SIGSTOP)
        time.sleep(0.1)

        running, stopped = ask({"w[0]": procs[0].pid, "w[1]": procs[1].pid}, str(tmp_path), ADDRESS)
    finally:
        for proc in procs:
            proc.kill()
    assert running.rank == "w[0]" and running.arrived is False
    assert running.where.startswith("not in a collective: at waiting_for_a_peer (")
    assert stopped == RankState("w[1]", None, "no answer within 2s: stopped, or hung outside Python")


def test_the_question_ends_once_every_rank_answered_without_waiting_out_the_answer_time(tmp_path, monkeypatch):
    monkeypatch.setattr(stacks, "ANSWER_S", 60.0)
    proc = subprocess.Popen([sys.executable, "-c", WAITING, str(tmp_path), ADDRESS], stdout=subprocess.PIPE)
    states, waits = [], []
    try:
        assert proc.stdout.readline().strip() == b"ready"
        for _ in range(2):  # the second time its answer file holds the first answer: only what follows it counts
            asked = time.monotonic()
            states += ask({"w[0]": proc.pid}, str(tmp_path), ADDRESS)
            waits.append(time.monotonic() - asked)
    finally:
        proc.kill()
    assert len(states) == 2
    assert all(state.where.startswith("not in a collective: at waiting_for_a_peer (") for state in states)
    assert max(waits) < 30.0  # the answers, not the 60 s allowed for one


def _dump(*threads: list[tuple[str, int, str]]) -> str:
    """A faulthandler dump of these threads, each its frames (file, line, function), the most recent first."""
    blocks = []
    for i, frames in enumerate(threads):
        lines = [f"Thread 0x{i:016x} (most recent call first):"]
        lines += [f'  File "{path}", line {line} in {func}' for path, line, func in frames]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def test_a_rank_waiting_outside_a_collective_is_named_with_the_code_that_waits_and_whether_a_call_runs():
    stdlib = sysconfig.get_paths()["stdlib"]
    wait, at_wait = (f"{stdlib}/threading.py", 331, "wait"), f"at wait ({Path(stdlib).name}/threading.py:331)"
    idle = [wait, ("/x/ray/_private/worker.py", 900, "main_loop")]
    receiving = [wait, ("/x/m2flow/runtime/channels.py", 210, "recv"), ("/x/m2flow/runtime/host.py", 180, "call")]
    where = _state("env[0]", _dump(idle, receiving)).where
    assert where == f"not in a collective: {at_wait}, called from recv (runtime/channels.py:210)"
    assert _state("env[0]", _dump(idle)).where == (
        f"not in a collective: {at_wait}, called from main_loop (_private/worker.py:900)"
        " (running no call of its worker)"
    )


def test_the_explanation_names_the_ranks_that_arrived_and_those_that_did_not():
    states = [
        RankState("actor[0]", True, "in all_reduce (distributed/distributed_c10d.py:10), called from step (a/b.py:3)"),
        RankState("actor[1]", None, "no answer within 2s: stopped, or hung outside Python"),
    ]
    assert explain("actor", states) == (
        "process group of 'actor': 1 of 2 ranks in a collective; arrived: actor[0] in all_reduce"
        " (distributed/distributed_c10d.py:10), called from step (a/b.py:3); not arrived: actor[1] no answer within"
        " 2s: stopped, or hung outside Python"
    )


def test_the_explanation_names_the_ranks_that_finished_their_part_apart_from_those_still_out():
    states = [RankState("rollout[1]", False, "not in a collective: at load_weights (tests/w.py:9)")]
    assert explain("sync actor.weights -> rollout.load_weights", states, finished=("actor[0]", "rollout[0]")) == (
        "process group of 'sync actor.weights -> rollout.load_weights': 0 of 3 ranks in a collective;"
        " finished: actor[0], rollout[0]; not arrived: rollout[1] not in a collective: at load_weights (tests/w.py:9)"
    )


DUMP = """Thread 0x00007f0139dbf6c0 (most recent call first):
  File "/py/lib/python3.11/threading.py", line 327 in wait
  File "/py/lib/python3.11/site-packages/ray/_private/gc_collect_manager.py", line 29 in run

Current thread 0x00007f0343c14b80 (most recent call first):
  File "/py/site-packages/torch/distributed/distributed_c10d.py", line 4287 in all_gather
  File "/py/site-packages/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/work/main/workers/actor/backends.py", line 131 in gather_data_ranks
  File "/work/main/m2flow/runtime/host.py", line 222 in _invoke
"""


def test_a_dump_is_read_thread_by_thread_the_collective_and_its_caller_from_the_same_thread():
    assert _state("actor[0]", DUMP) == RankState(
        "actor[0]",
        True,
        "in all_gather (distributed/distributed_c10d.py:4287), called from gather_data_ranks (actor/backends.py:131)",
    )
    computing = DUMP.replace("torch/distributed", "torch/nn").replace("all_gather", "linear")
    assert _state("actor[1]", computing) == RankState(
        "actor[1]", False, "not in a collective: at linear (nn/distributed_c10d.py:4287)"
    )
