"""The synthetic workers' spin is work of a known CPU cost, so the planner's contention model can be checked."""

import threading
import time

from m2flow.workers.synthetic import spin


def test_spin_runs_its_seconds_of_cpu_time_while_another_thread_takes_turns_on_the_interpreter():
    stop = threading.Event()

    def rival() -> None:  # holds the GIL half the time: a spin on the wall clock would run about half its seconds
        while not stop.is_set():
            pass

    other = threading.Thread(target=rival)
    other.start()
    try:
        before = time.thread_time()
        spin(0.05)
        used = time.thread_time() - before
    finally:
        stop.set()
        other.join()
    assert used >= 0.05
