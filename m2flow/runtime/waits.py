"""Every wait on a remote call has a deadline, and every failure names the worker and replica."""

from __future__ import annotations

import contextlib
import re
import time
from dataclasses import dataclass, field
from typing import Any

from m2flow.errors import M2FlowError, WaitTimeout, WorkerError


@dataclass
class Deadline:
    seconds: float
    waiting_for: str
    start: float = field(default_factory=time.monotonic)

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.start)


def wait_all(calls: list[tuple[Any, Any, str]], deadline: Deadline) -> list[Any]:
    """`calls` are (object ref, replica, what it does). Results in order; the first failure raises at once."""
    import ray

    index = {ref: i for i, (ref, _, _) in enumerate(calls)}
    results: list[Any] = [None] * len(calls)
    pending = [ref for ref, _, _ in calls]
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline.left()))
        if not ready:
            # a worker that gave up waiting on a peer says exactly who and what: prefer its error
            grace = min(5.0, 0.5 * deadline.seconds)
            for ref in ray.wait(pending, num_returns=len(pending), timeout=grace)[0]:
                _, replica, what = calls[index[ref]]
                get(ref, replica, what)
            stuck = ", ".join(
                f"{calls[index[r]][1].worker}[{calls[index[r]][1].index}] ({calls[index[r]][2]})" for r in pending[:6]
            )
            raise WaitTimeout(
                f"waited {deadline.seconds:g}s for {deadline.waiting_for}; still running: {stuck}."
                f" A worker may be hung; its log is under {log_dir()}. Raise run.timeouts if it is just slow",
                tuple(calls[index[r]][1] for r in pending),
            )
        ref = ready[0]
        _, replica, what = calls[index[ref]]
        results[index[ref]] = get(ref, replica, what)
    return results


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
            raise WorkerError(f"worker '{replica.worker}' replica {replica.index} failed to start:\n{detail}") from None
        raise WorkerError(
            f"worker '{replica.worker}' replica {replica.index} died during {what} (process killed, crashed or out of"
            f" memory): {str(exc).splitlines()[0]}. Its log is under {log_dir()}; a crash's stacks, under the run's"
            " crashes/ folder"
        ) from None


def log_dir() -> str:
    try:
        import ray

        return ray._private.worker._global_node.get_logs_dir_path()  # noqa: SLF001 - no public accessor
    except Exception:  # noqa: BLE001
        return "/tmp/ray/session_latest/logs"
