"""Errors a user can cause. The CLI prints them without a traceback and exits non-zero."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`"; did you mean '<the closest of known>'?"` where one is close to `name` (a misspelling), else ""."""
    close = difflib.get_close_matches(name, sorted(known), n=1)
    return f"; did you mean '{close[0]}'?" if close else ""


class M2FlowError(Exception):
    """Base of every user-facing error: the message names what was wrong, where, and the fix."""


class SpecError(M2FlowError):
    """A workflow declaration (YAML or Python) is invalid; carries every problem found."""

    def __init__(self, problems: list[str], source: str | None = None):
        self.problems = problems
        self.source = source
        where = f"{source}: " if source else ""
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{where}invalid workflow ({len(problems)} problem(s)):\n{lines}")


class PlanError(M2FlowError):
    """No plan can run this workflow on this cluster (memory, device count, placement)."""


class WorkerError(M2FlowError):
    """A worker raised, died, or failed to start; names the worker, replica and port."""


class CheckpointError(M2FlowError):
    """A checkpoint cannot be written (a worker's state a weights-only load refuses) or read (a damaged file)."""


class WaitTimeout(M2FlowError):
    """A wait ran past its deadline; names what it was waiting for (`stuck`: the replicas still running)."""

    def __init__(self, message: str, stuck: tuple = ()):
        super().__init__(message)
        self.stuck = stuck

    def detailed(self, detail: str) -> WaitTimeout:
        """The same timeout with `detail` (where the stuck ones are) at the end of its first line."""
        if not detail:
            return self
        first, _, rest = str(self).partition("\n")
        return WaitTimeout(f"{first} {detail}" + (f"\n{rest}" if rest else ""), self.stuck)


class EnvFailed(Exception):  # noqa: N818 - what a simulator worker raises, not a user's mistake
    """Raised by a simulator worker's port to name the env (its global index) whose reset or step failed.
    The runtime counts failures per env; with `run.on_failure: replace` one that keeps failing is quarantined:
    started again from a new seed (`WorkerContext.env_seed`) and reported."""

    def __init__(self, env: int, why: str):
        self.env, self.why = int(env), why
        super().__init__(f"env {env} failed: {why}")

    def __reduce__(self):
        return (EnvFailed, (self.env, self.why))


class MissingDependency(M2FlowError):
    """An optional dependency is not installed; names the extra that provides it."""
