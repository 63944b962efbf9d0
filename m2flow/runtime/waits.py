"""Every wait on a remote call has a deadline, and every failure names the worker and replica."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from m2flow.errors import M2FlowError, WaitTimeout, WorkerError
from m2flow.runtime.pulse import BEAT_FILE_EVERY_S, Watch
from m2flow.schedule import ReplicaId


@dataclass
class Deadline:
    seconds: float
    waiting_for: str
    watch: Watch | None = None  # the beat files of the processes awaited: a silent one is hung before the deadline
    naming: Watch | None = None  # the beat files read, past the deadline, for the loop call a stuck process is in
    start: float = field(default_factory=time.monotonic)

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.start)

    def in_call(self, replica: ReplicaId) -> str:
        """What `replica`'s process is in, still running past the deadline, as its beat file says ("" unknown)."""
        return self.naming.in_call(replica) if self.naming is not None else ""


def next_ready(pending: list[Any], deadline: Deadline, replica_of: Callable[[Any], Any]) -> tuple[list[Any], dict]:
    """The first of `pending` (object refs) to finish, waiting at most until `deadline`: ([ref], {}); or, the
    ids of the replicas (`replica_of` a ref) whose process fell silent first, with how long (`deadline.watch`):
    ([], silent); ([], {}) at the deadline."""
    import ray

    while True:
        left = max(0.0, deadline.left())
        step = left if deadline.watch is None else min(left, BEAT_FILE_EVERY_S)
        ready, _ = ray.wait(pending, num_returns=1, timeout=step)
        if ready or deadline.left() <= 0 or deadline.watch is None:
            return ready, {}
        if silent := deadline.watch.silent([replica_of(ref).id for ref in pending]):
            done, _ = ray.wait(pending, num_returns=1, timeout=0)  # a call that ended meanwhile is no hang
            return done, {} if done else silent


def silent_timeout(silent: dict[ReplicaId, float], deadline: Deadline, stuck: tuple = ()) -> WaitTimeout:
    """The failure of calls whose processes fell silent (`silent`: replica id -> seconds)."""
    names = ", ".join(f"{replica} for {age:.1f}s" for replica, age in silent.items())
    return WaitTimeout(
        f"no beat from {names} (a process stopped, or stuck in native code that holds the GIL) while waiting for"
        f" {deadline.waiting_for}. If a call of yours holds the GIL that long, raise run.timeouts.silence_s",
        stuck,
    )


def wait_all(calls: list[tuple[Any, Any, str]], deadline: Deadline) -> list[Any]:
    """`calls` are (object ref, replica, what it does). Results in order; the first failure raises at once."""
    import ray

    index = {ref: i for i, (ref, _, _) in enumerate(calls)}
    results: list[Any] = [None] * len(calls)
    pending = [ref for ref, _, _ in calls]
    while pending:
        ready, silent = next_ready(pending, deadline, lambda ref: calls[index[ref]][1])
        if silent:
            raise silent_timeout(silent, deadline, tuple(r for _, r, _ in calls if r.id in silent))
        pending = [ref for ref in pending if ref not in ready]
        if not ready:
            # a worker that gave up waiting on a peer says exactly who and what: prefer its error
            grace = min(5.0, 0.5 * deadline.seconds)
            for ref in ray.wait(pending, num_returns=len(pending), timeout=grace)[0]:
                _, replica, what = calls[index[ref]]
                get(ref, replica, what)
            stuck = ", ".join(_stuck(*calls[index[r]][1:], deadline) for r in pending[:6])
            raise WaitTimeout(
                f"waited {deadline.seconds:g}s for {deadline.waiting_for}; still running: {stuck}."
                f" A worker may be hung; its log is under {log_dir()}. Raise run.timeouts if it is just slow",
                tuple(calls[index[r]][1] for r in pending),
            )
        ref = ready[0]
        _, replica, what = calls[index[ref]]
        results[index[ref]] = get(ref, replica, what)
    return results


def _stuck(replica: Any, what: str, deadline: Deadline) -> str:
    """A replica still running past `deadline`, what it was asked, and the call its process is in, where its beat
    file says: "env[0] (the loop, in env.step for 61s)"."""
    in_call = deadline.in_call(replica.id)
    return f"{replica.worker}[{replica.index}] ({what}{', ' + in_call if in_call else ''})"


def finished(ref: Any) -> bool:
    """Whether a remote call has finished (returned or failed), without waiting."""
    import ray

    return bool(ray.wait([ref], timeout=0)[0])


def died(ref: Any, deadline: Deadline) -> bool:
    """Whether the process a call went to died before it answered (by the deadline); its other failures
    are the caller's to report."""
    import ray

    try:
        ray.get(ref, timeout=max(0.0, deadline.left()))
    except ray.exceptions.RayActorError:
        return True
    except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
        return False
    return False


def settle(refs: list[Any], timeout_s: float = 0.0) -> list[Any]:
    """Calls whose failure is already accounted for: the errors of those that end within `timeout_s` are
    taken (not left for Ray to report as unhandled); returns those still running, to settle later (a call
    queued behind others fails only when its turn comes)."""
    import ray

    ended, running = ray.wait(refs, num_returns=len(refs), timeout=timeout_s) if refs else ([], [])
    for ref in ended:
        with contextlib.suppress(ray.exceptions.RayError):
            ray.get(ref)
    return running


# the line where Ray's message of a failed task or actor start says "Traceback (most recent call last):": its
# process title, pid, address and the actor's repr, "ray::m2flow:wf:env:0:WorkerHost.__init__() (pid=1, repr=<...>)"
RAY_TASK_HEADER = re.compile(r"^[^\n]*?ray::\S+\(\) \(pid=\d+[^\n]*\)\n", re.MULTILINE)


def get(ref: Any, replica: Any, what: str) -> Any:
    import ray

    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, M2FlowError):
            raise cause from None
        raise WorkerError(f"worker '{replica.worker}' replica {replica.index} failed during {what}:\n{exc}") from None
    except ray.exceptions.RayActorError as exc:
        if getattr(exc, "actor_init_failed", False):
            detail = re.sub(r"\x1b\[[0-9;]*m", "", getattr(exc, "error_msg", "") or str(exc))
            own = detail.find(f"worker '{replica.worker}' replica {replica.index} failed in port '__init__'")
            if own >= 0:  # the worker's own traceback, without Ray's actor repr and m2flow's host frames
                detail = detail[own:].split("\n", 1)[-1]
            detail = RAY_TASK_HEADER.sub("", detail)
            raise WorkerError(f"worker '{replica.worker}' replica {replica.index} failed to start:\n{detail}") from None
        said = str(exc).splitlines()[0].rstrip(".")
        raise WorkerError(
            f"worker '{replica.worker}' replica {replica.index} died during {what} (process killed, crashed or out of"
            f" memory): {said}. Its log is under {log_dir()}; a crash's stacks, under the run's crashes/ folder"
        ) from None


def log_dir() -> str:
    try:
        import ray

        return ray._private.worker._global_node.get_logs_dir_path()  # noqa: SLF001 - no public accessor
    except Exception:  # noqa: BLE001
        return "/tmp/ray/session_latest/logs"
