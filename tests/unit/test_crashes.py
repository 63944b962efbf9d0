"""A worker process's crash record: a process that crashes inside `working_on(env)` is found to have crashed
there; one killed from outside blames no env, nor does a crash outside any env or in another thread than
the one working on it; a nested block hands back the env it is nested in."""

from __future__ import annotations

import signal
import subprocess
import sys

from m2flow.runtime.crashes import Crash, crashed

ADDRESS = "10.0.0.7"
PROCESS = """
import ctypes, sys, threading, time
import m2flow
from m2flow.runtime.crashes import record_here

record_here(sys.argv[1], "10.0.0.7")
ctx, how = m2flow.context(), sys.argv[2]
with ctx.working_on(2):
    pass  # done with env 2: not blamed
if how == "outside any env":
    ctypes.string_at(0)
with ctx.working_on(5):
    with ctx.working_on(6):
        pass  # back in env 5 after it
    print("ready", flush=True)
    if how == "segfault":
        ctypes.string_at(0)
    if how == "another thread":
        threading.Thread(target=ctypes.string_at, args=(0,)).start()
    time.sleep(60)
"""


def start(run_dir, how: str) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", PROCESS, str(run_dir), how], stdout=subprocess.PIPE, text=True)
    if how != "outside any env":
        assert process.stdout.readline().strip() == "ready"
    return process


def test_a_process_that_segfaults_in_an_env_is_found_to_have_crashed_working_on_it(tmp_path):
    process = start(tmp_path, "segfault")
    assert process.wait(timeout=30) == -signal.SIGSEGV

    crash = crashed(str(tmp_path), ADDRESS, process.pid)
    assert crash == Crash("Segmentation fault", 5, tmp_path / "crashes" / f"{ADDRESS}-{process.pid}.txt")
    assert str(crash).startswith("it crashed: Segmentation fault while working on env 5 (its stacks: ")


def test_a_process_killed_from_outside_blames_no_env(tmp_path):
    process = start(tmp_path, "hang")
    process.kill()
    process.wait(timeout=30)

    assert crashed(str(tmp_path), ADDRESS, process.pid) is None


def test_a_process_that_crashes_outside_any_env_names_its_crash_but_no_env(tmp_path):
    process = start(tmp_path, "outside any env")
    assert process.wait(timeout=30) == -signal.SIGSEGV

    crash = crashed(str(tmp_path), ADDRESS, process.pid)
    assert crash is not None and crash.fatal == "Segmentation fault" and crash.env is None


def test_a_crash_in_another_thread_than_the_one_working_on_an_env_blames_no_env(tmp_path):
    process = start(tmp_path, "another thread")
    assert process.wait(timeout=30) == -signal.SIGSEGV

    crash = crashed(str(tmp_path), ADDRESS, process.pid)
    assert crash is not None and crash.env is None


def test_a_record_is_found_only_for_its_own_node_and_pid(tmp_path):
    process = start(tmp_path, "segfault")
    process.wait(timeout=30)

    assert crashed(str(tmp_path), "10.0.0.8", process.pid) is None  # the same pid on another host
    assert crashed(str(tmp_path), ADDRESS, 12345) is None
