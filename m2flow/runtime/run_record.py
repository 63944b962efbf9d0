"""What a run leaves: its result (the iterations' metrics, the failures, where each replica ran), one entry
of its failures, and the folder of an earlier run kept aside rather than overwritten."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from m2flow.runtime.relocate import Move
from m2flow.runtime.run_report import RunReport
from m2flow.schedule import Plan

log = logging.getLogger(__name__)


@dataclass
class RunResult:
    run_dir: Path
    plan: Plan
    iterations: int
    history: list[dict] = field(default_factory=list)
    failures: list[dict] = field(default_factory=list)
    nodes: dict[str, str] = field(default_factory=dict)  # "worker[replica]" -> Ray node it ran on
    pids: dict[str, int] = field(default_factory=dict)  # "worker[replica]" -> its process
    device_busy: dict[str, float] = field(default_factory=dict)  # device -> busy share of the measured iterations
    report: RunReport | None = None  # the end-of-run table's numbers (none where no iteration was measured)

    @property
    def last(self) -> dict:
        """The metrics of the last iteration (a metric appears only in iterations that report it)."""
        return self.history[-1] if self.history else {}

    def latest(self, key: str) -> float | None:
        """The last value `key` took in this run, e.g. `env/episode_return` (reported only by iterations in
        which an episode ended); None if it never did."""
        return next((h[key] for h in reversed(self.history) if key in h), None)


def failure_entry(
    iteration: int,
    error: str,
    detected_at: float,
    replaced: str | None = None,
    steps_redone: int = 0,
    env: int | None = None,
    quarantined: bool = False,
    state: str | None = None,
    spare: bool = False,
    moved: Move | None = None,
    seconds: float | None = None,
) -> dict:
    """One entry of `RunResult.failures`: `replaced` names the replica replaced in place (None: a restart),
    `env` the env its simulator said failed, `quarantined` whether that env was started from a new seed,
    `state` what the replacement started from, `spare` whether it ran in a spare process (`run.spares`),
    `borrowed` the core it borrowed off `lost_node` (an address) when the node it ran on no longer answered,
    `seconds` from when the failure was seen to the end of the replacement (and its redo)."""
    return {
        "iteration": iteration,
        "error": error,
        "detected_at": detected_at,
        "replaced": replaced,
        "steps_redone": steps_redone,
        "env": env,
        "quarantined": quarantined,
        "state": state,
        "spare": spare,
        "borrowed": None if moved is None else str(moved.borrowed),
        "lost_node": None if moved is None else moved.address,
        "seconds": seconds,
    }


def keep_previous(run_dir: Path) -> None:
    """A fresh run never overwrites an earlier one: its folder is renamed aside, with a timestamp."""
    if run_dir.exists() and any(run_dir.iterdir()):
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(run_dir.stat().st_mtime))
        aside = run_dir.with_name(f"{run_dir.name}.{stamp}")
        suffix = 1
        while aside.exists():
            aside = run_dir.with_name(f"{run_dir.name}.{stamp}-{suffix}")
            suffix += 1
        run_dir.rename(aside)
        log.warning("kept the previous run of %s in %s", run_dir.name, aside)
