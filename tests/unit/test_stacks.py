"""Asking a stuck process where it is: a real process answers with its stack, a stopped one does not."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from m2flow.runtime.stacks import RankState, ask, explain

WAITING = """
import sys, time
from m2flow.runtime.stacks import answer_when_asked
answer_when_asked(sys.argv[1])
def waiting_for_a_peer():
    print("ready", flush=True)
    time.sleep(60)
waiting_for_a_peer()
"""


def test_a_running_process_says_where_it_is_and_a_stopped_one_is_named_as_not_answering(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", WAITING, str(tmp_path)], stdout=subprocess.PIPE) for _ in "ab"]
    try:
        for proc in procs:
            assert proc.stdout.readline().strip() == b"ready"
        procs[1].send_signal(signal.SIGSTOP)
        time.sleep(0.1)

        running, stopped = ask({"w[0]": procs[0].pid, "w[1]": procs[1].pid}, str(tmp_path))
    finally:
        for proc in procs:
            proc.kill()
    assert running.rank == "w[0]" and running.arrived is False
    assert running.where.startswith("not in a collective: at waiting_for_a_peer (")
    assert stopped == RankState("w[1]", None, "no answer within 2s: stopped, or hung outside Python")


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
