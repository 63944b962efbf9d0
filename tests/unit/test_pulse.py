"""The driver's reading of worker processes' beat files: a running process whose file is older than the
silence bound is silent; a fresh file, a process that is gone (its death is Ray's to report) or one on
another host (no file here) is not; a process's beat-file thread keeps its file fresh until it is stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from m2flow.runtime.pulse import BEAT_FILE_EVERY_S, Watch, beat_file
from m2flow.schedule import ReplicaId

ENV0, ENV1, ACTOR0 = ReplicaId("env", 0), ReplicaId("env", 1), ReplicaId("actor", 0)


def replica(rid: ReplicaId) -> SimpleNamespace:
    return SimpleNamespace(id=rid)


def aged(path: Path, seconds: float) -> Path:
    path.touch()
    then = time.time() - seconds
    os.utime(path, (then, then))
    return path


def gone_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_running_process_whose_beat_file_is_older_than_the_silence_bound_is_silent_and_only_it(tmp_path):
    watch = Watch(
        {
            ENV0: (aged(tmp_path / "stale", 7.0), os.getpid()),
            ENV1: (aged(tmp_path / "fresh", 0.1), os.getpid()),
            ACTOR0: (aged(tmp_path / "stale-gone", 7.0), gone_pid()),
        },
        silence_s=5.0,
    )
    silent = watch.silent([replica(ENV0), replica(ENV1), replica(ACTOR0), replica(ReplicaId("elsewhere", 0))])

    assert list(silent) == [ENV0]
    assert silent[ENV0] == pytest.approx(7.0, abs=1.0)


def test_a_process_beats_from_a_thread_while_its_main_thread_sleeps_and_falls_silent_once_stopped(tmp_path):
    beat = (
        "import time; from m2flow.runtime.pulse import beat_while_alive;"
        f" beat_while_alive({str(tmp_path)!r}, 'here'); print('beating', flush=True); time.sleep(30)"
    )
    child = subprocess.Popen([sys.executable, "-c", beat], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "beating"
        path = beat_file(str(tmp_path), "here", child.pid)
        time.sleep(6 * BEAT_FILE_EVERY_S)
        assert time.time() - path.stat().st_mtime < 3 * BEAT_FILE_EVERY_S
        watch = Watch({ENV0: (path, child.pid)}, silence_s=4 * BEAT_FILE_EVERY_S)
        assert watch.silent([replica(ENV0)]) == {}
        os.kill(child.pid, signal.SIGSTOP)
        time.sleep(watch.silence_s + 2 * BEAT_FILE_EVERY_S)
        assert list(watch.silent([replica(ENV0)])) == [ENV0]
    finally:
        child.kill()
        child.wait()
