"""What a run measured, set beside its plan at its end: predicted vs measured seconds per port and busy share
per device, the ports that drifted and what was done about it, and where the loop's time went. The same
numbers as data (`RunReport`): `RunResult.report`, and `report.json` in the run's folder."""

from __future__ import annotations

import json
import os
import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from m2flow.planners.trace_calls import work_share
from m2flow.runtime.iteration_metrics import Measured
from m2flow.runtime.reporting import Reporter
from m2flow.schedule import Plan
from m2flow.viz.tables import comparison_table, drift_notes, loop_table


@dataclass(frozen=True)
class SparseRuns:
    """A port that only phases run once in `every` iterations call, and the `runs` it had in `iterations`
    measured iterations: the plan predicts its seconds per iteration at one run in `every`."""

    every: int
    runs: int
    iterations: int

    @property
    def rate(self) -> float:
        """Its runs against the plan's rate (an evaluation every 49 iterations run 3 times in the 195 measured
        after the warm-up: 0.75)."""
        return self.runs * self.every / self.iterations


def sparse_runs(plan: Plan, iterations: list[int]) -> dict[str, SparseRuns]:
    """Per port that only phases of one rate below every iteration call, the runs they are due in `iterations`
    (a port that phases of other rates call too, a weight source for both an every-iteration and a sparse sync,
    is left out). Counted as due: an asynchronous flow that drops stale batches may hold a sync back to a later
    iteration."""
    rates: dict[str, set[int]] = defaultdict(set)
    for phase in plan.phases:
        for edge in phase.edges:
            for ref in (edge.src, edge.dst):
                rates[str(ref)].add(phase.every)
    sparse = {}
    for port, everies in rates.items():
        if len(everies) == 1 and (every := next(iter(everies))) > 1 and iterations:
            sparse[port] = SparseRuns(every, sum(1 for i in iterations if i % every == 0), len(iterations))
    return sparse


def measured_iterations(history: list[dict], since: int, has_loop: bool) -> list[dict]:
    """The iterations the measurements cover: after `since` (it warmed up), and none that only finished an
    asynchronous segment's training (no loop: not an iteration as the plan predicts it)."""
    return [h for h in history if h["iteration"] > since and (not has_loop or "time/loop_s" in h)]


@dataclass(frozen=True)
class Compared:
    """One quantity per iteration: as the plan predicted it, and the measured iterations' mean."""

    predicted: float
    measured: float


@dataclass(frozen=True)
class RunReport:
    """The end-of-run table as data, over `iterations` measured iterations: seconds per iteration, per phase and
    per port, and each device's busy share, predicted beside measured (a port or device the plan did not
    predict reads 0 there; a port run once in k iterations is predicted for the runs it had in them, which
    `sparse` holds, `sparse_runs`: the phases, the iteration and the devices stay at the plan's rate);
    `median_iteration_s`, the measured iterations' median (work done once in k iterations, an evaluation,
    lengthens a few of them and the mean)."""

    iterations: int
    iteration_s: Compared
    median_iteration_s: float
    phase_s: dict[str, Compared]
    port_s: dict[str, Compared]
    device_busy: dict[str, Compared]
    sparse: dict[str, SparseRuns] = field(default_factory=dict)

    def measured_busy(self) -> dict[str, float]:
        """Each device's measured busy share, of the devices that worked in the measured iterations."""
        return {device: busy.measured for device, busy in self.device_busy.items() if busy.measured > 0}

    def save(self, path: Path) -> None:
        """As JSON, atomically (a temporary file renamed into place)."""
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        os.replace(tmp, path)


def report_run(
    plan: Plan, measured: Measured, events: list[dict], ran: list[dict], replanned: bool, reporter: Reporter
) -> RunReport:
    """Print the end-of-run tables for the iterations `ran`, and return their numbers. A port that runs once in k
    iterations is predicted for the runs it had in them (`sparse_runs`), and a line under the table says so."""
    iterations_s = [h["time/iteration_s"] for h in ran]
    iteration_s = statistics.mean(iterations_s)
    share = work_share({"traceEvents": events})  # as the plan counts a call: its own work
    port_s = {port: seconds * share.get(port, 1.0) for port, seconds in measured.port_s.items()}
    sparse = sparse_runs(plan, [h["iteration"] for h in ran])
    predicted_port_s = {
        port: seconds * (sparse[port].rate if port in sparse else 1.0)
        for port, seconds in plan.predicted.port_s.items()
    }
    plan = replace(plan, predicted=replace(plan.predicted, port_s=predicted_port_s))
    reporter.print(comparison_table(plan, port_s, measured.device_s, len(ran), iteration_s))
    for port, runs in sorted(sparse.items()):
        if runs.rate != 1.0:
            reporter.print(
                f"{port}: ran {runs.runs} time(s) in the {runs.iterations} measured iterations, where one in"
                f" {runs.every} gives {runs.iterations / runs.every:.3g}: predicted for its {runs.runs}"
            )
    for line in drift_notes(plan, port_s, len(ran), replanned):
        reporter.print(line)
    if measured.loop_busy_s:
        table, verdict = loop_table(plan, measured.loop_busy_s, measured.loop_s)
        reporter.print(table)
        reporter.print(verdict)
    predicted = plan.predicted
    wall_s = len(ran) * iteration_s
    return RunReport(
        iterations=len(ran),
        iteration_s=Compared(predicted.iteration_s, iteration_s),
        median_iteration_s=statistics.median(iterations_s),
        phase_s={
            phase: Compared(predicted_s, statistics.mean(h.get(f"time/{phase}_s", 0.0) for h in ran))
            for phase, predicted_s in sorted(predicted.phase_s.items())
            if any(f"time/{phase}_s" in h for h in ran)  # the controller's own time is not a phase it times
        },
        port_s={
            port: Compared(predicted.port_s.get(port, 0.0), port_s.get(port, 0.0) / len(ran))
            for port in sorted(set(predicted.port_s) | set(port_s))
        },
        device_busy={
            device.name: Compared(predicted.device_busy.get(device, 0.0), measured.device_s.get(device, 0.0) / wall_s)
            for device in sorted(set(predicted.device_busy) | set(measured.device_s))
        }
        if wall_s
        else {},
        sparse=sparse,
    )
