"""A CPU core the kernel time-shares among the processes placed on it.

The kernel gives every runnable process on a core a turn of a few milliseconds, which is as long as a
simulator's step or a small policy's call: two processes that both have work share the core, each at about
half speed, rather than one waiting for the other's call to end. The simulator models such a core as
processor sharing: each of the n processes with a task in progress runs at 1/n of the core, and a process's
own tasks run one at a time, in the order they became ready. What that changes against a first-come
first-served device: when a process starts a call (a policy that merges the slices that have arrived by
then starts at once, not after the simulator's next slice), and the latency of each call; the core's work
per step is the same.

A GPU is not modelled so: its processes' kernels queue on the device.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

from m2flow.cluster import DeviceId
from m2flow.planners.processes import process_of
from m2flow.schedule import ReplicaId

DONE = 1e-12  # seconds of work left that count as none (rounding)


class TimeSharedCore:
    """One core's tasks in progress, each with its work left, and those queued behind their process's."""

    def __init__(self) -> None:
        self.now = 0.0
        self.left: dict[int, float] = {}  # task id -> seconds of work left, of the tasks in progress
        self.process_of: dict[int, Hashable] = {}  # of the tasks in progress
        self.queued: dict[Hashable, deque[int]] = {}  # a process with a task in progress -> its tasks behind it
        self.token = -1  # names the pending end event: an older one is stale

    def advance(self, t: float) -> None:
        """Run the tasks in progress, sharing the core, up to time `t`."""
        if self.left and t > self.now:
            done = (t - self.now) / len(self.left)
            for tid in self.left:
                self.left[tid] -= done
        self.now = max(self.now, t)

    def arrive(self, tid: int, process: Hashable) -> bool:
        """Task `tid` of `process` is ready now: True if its process is free to start it now, False if it
        queues behind the process's task in progress."""
        queue = self.queued.get(process)
        if queue is not None:
            queue.append(tid)
            return False
        self.queued[process] = deque()
        self.process_of[tid] = process
        return True

    def start(self, tid: int, work_s: float) -> None:
        self.left[tid] = work_s

    def next_end(self) -> float | None:
        """When the next task in progress ends if nothing else arrives (None if none is in progress)."""
        if not self.left:
            return None
        return self.now + min(self.left.values()) * len(self.left)

    def finish(self) -> tuple[list[int], list[int]]:
        """The tasks that end now (the least work left), and the next tasks of their processes, which start now."""
        least = min(self.left.values())
        ended = [tid for tid, left in self.left.items() if left <= least + DONE]
        following = []
        for tid in ended:
            del self.left[tid]
            process = self.process_of.pop(tid)
            queue = self.queued[process]
            if queue:
                nxt = queue.popleft()
                self.process_of[nxt] = process
                following.append(nxt)
            else:
                del self.queued[process]
        return ended, following


def time_shared_cores(devices: dict[str, list[DeviceId]], together: dict[ReplicaId, int]) -> set[DeviceId]:
    """The CPU cores that host more than one process: each replica's, or its co-hosting group's."""
    processes_on: dict[DeviceId, set[Hashable]] = {}
    for worker, replica_devices in devices.items():
        for replica, device in enumerate(replica_devices):
            if device.kind == "cpu":
                processes_on.setdefault(device, set()).add(process_of(together, ReplicaId(worker, replica)))
    return {device for device, processes in processes_on.items() if len(processes) > 1}
