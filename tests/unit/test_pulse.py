"""The driver's reading of worker processes' beat files: a running process whose file stops changing for the
silence bound (of the driver's clock) is silent; one whose file changes, a process that is gone (its death
is Ray's to report) or one with no file here (on another host) is not; a process's beat-file thread keeps
its file changing while its main thread sleeps, and stops when the process is stopped; the file names the loop
call its process is in."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

from m2flow.runtime.pulse import BEAT_FILE_EVERY_S, Watch, beat_file
from m2flow.schedule import ReplicaId

STILL, BEATING, GONE, ELSEWHERE = (ReplicaId(w, 0) for w in ("still", "beating", "gone", "elsewhere"))


def gone_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_running_process_whose_beat_file_stops_changing_for_the_silence_bound_is_silent_and_only_it(tmp_path):
    for name in ("still", "beating", "gone"):
        (tmp_path / name).touch()
    files = {STILL: (tmp_path / "still", os.getpid()), BEATING: (tmp_path / "beating", os.getpid())}
    watch = Watch({**files, GONE: (tmp_path / "gone", gone_pid())}, silence_s=0.6)
    replicas = [STILL, BEATING, GONE, ELSEWHERE]

    assert watch.silent(replicas) == {}  # first seen: nothing is known of how long they were still
    for _ in range(4):
        time.sleep(0.25)
        os.utime(tmp_path / "beating")
        silent = watch.silent(replicas)

    assert list(silent) == [STILL]
    assert 0.6 < silent[STILL] < 2.0


def test_a_process_beats_from_a_thread_while_its_main_thread_sleeps_and_falls_silent_once_stopped(tmp_path):
    beat = (
        "import time; from m2flow.runtime.pulse import beat_while_alive;"
        f" beat_while_alive({str(tmp_path)!r}, 'here'); print('beating', flush=True); time.sleep(60)"
    )
    child = subprocess.Popen([sys.executable, "-c", beat], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "beating"
        watch = Watch(
            {STILL: (beat_file(str(tmp_path), "here", child.pid), child.pid)}, silence_s=4 * BEAT_FILE_EVERY_S
        )
        for _ in range(12):
            time.sleep(BEAT_FILE_EVERY_S / 2)
            assert watch.silent([STILL]) == {}
        os.kill(child.pid, signal.SIGSTOP)
        time.sleep(2 * BEAT_FILE_EVERY_S)
        assert watch.silent([STILL]) == {}  # its last beat seen: silent from here on
        time.sleep(watch.silence_s + BEAT_FILE_EVERY_S)
        assert list(watch.silent([STILL])) == [STILL]
    finally:
        child.kill()
        child.wait()


def test_a_beat_file_names_the_loop_call_its_process_is_in_and_that_it_stopped_beating(tmp_path):
    calling = (
        "import time; from m2flow.runtime.pulse import beat_while_alive, calling;"
        f" beat_while_alive({str(tmp_path)!r}, 'here')\n"
        "with calling('env.step'):\n    print('calling', flush=True); time.sleep(60)"
    )
    child = subprocess.Popen([sys.executable, "-c", calling], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "calling"
        watch = Watch(
            {STILL: (beat_file(str(tmp_path), "here", child.pid), child.pid)}, silence_s=4 * BEAT_FILE_EVERY_S
        )
        time.sleep(3 * BEAT_FILE_EVERY_S)
        assert re.fullmatch(r"in env\.step for \d+s", watch.in_call(STILL)), watch.in_call(STILL)
        os.kill(child.pid, signal.SIGSTOP)
        time.sleep(watch.silence_s + 2 * BEAT_FILE_EVERY_S)
        said = watch.in_call(STILL)
        assert said.startswith("no beat for ") and said.endswith("; last in env.step"), said
        assert watch.in_call(ELSEWHERE) == ""  # no file on this host: nothing said
    finally:
        child.kill()
        child.wait()
