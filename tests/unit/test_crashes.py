"""A worker process's crash record: a process that crashes inside `working_on(env)` is found to have crashed
there; one killed from outside, or that crashed outside any env, blames none."""

from __future__ import annotations

import signal
import subprocess
import sys

from m2flow.runtime.crashes import Crash, crashed

PROCESS = """
import ctypes, sys, time
import m2flow
from m2flow.runtime.crashes import record_here

record_here(sys.argv[1])
ctx = m2flow.context()
with ctx.working_on(2):
    pass  # done with env 2: not blamed
with ctx.working_on(5):
    print("ready", flush=True)
    if sys.argv[2] == "segfault":
        ctypes.string_at(0)
    time.sleep(60)
"""
OUTSIDE_ANY_ENV = """
import ctypes, sys
from m2flow.runtime.crashes import record_here

record_here(sys.argv[1])
ctypes.string_at(0)
"""


def start(code: str, run_dir, how: str = "segfault") -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", code, str(run_dir), how], stdout=subprocess.PIPE, text=True)
    if code is PROCESS:
        assert process.stdout.readline().strip() == "ready"
    return process


def test_a_process_that_segfaults_in_an_env_is_found_to_have_crashed_working_on_it(tmp_path):
    process = start(PROCESS, tmp_path)
    assert process.wait(timeout=30) == -signal.SIGSEGV

    crash = crashed(str(tmp_path), process.pid)
    assert crash == Crash("Segmentation fault", 5, tmp_path / "crashes" / f"{process.pid}.txt")
    assert str(crash).startswith("it crashed: Segmentation fault while working on env 5 (its stacks: ")


def test_a_process_killed_from_outside_blames_no_env(tmp_path):
    process = start(PROCESS, tmp_path, "hang")
    process.kill()
    process.wait(timeout=30)

    assert crashed(str(tmp_path), process.pid) is None


def test_a_process_that_crashes_outside_any_env_names_its_crash_but_no_env(tmp_path):
    process = start(OUTSIDE_ANY_ENV, tmp_path)
    assert process.wait(timeout=30) == -signal.SIGSEGV

    crash = crashed(str(tmp_path), process.pid)
    assert crash is not None and crash.fatal == "Segmentation fault" and crash.env is None


def test_a_process_with_no_record_has_not_crashed(tmp_path):
    assert crashed(str(tmp_path), 12345) is None
