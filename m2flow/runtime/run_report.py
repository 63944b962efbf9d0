"""What a run measured, set beside its plan at its end: predicted vs measured seconds per port and busy share
per device, the ports that drifted and what was done about it, and where the loop's time went."""

from __future__ import annotations

from m2flow.planners.fit import work_share
from m2flow.runtime.iteration_metrics import Measured
from m2flow.runtime.reporting import Reporter
from m2flow.schedule import Plan
from m2flow.viz.tables import comparison_table, drift_notes, loop_table


def measured_iterations(history: list[dict], since: int, has_loop: bool) -> list[dict]:
    """The iterations the measurements cover: after `since` (it warmed up), and none that only finished an
    asynchronous segment's training (no loop: not an iteration as the plan predicts it)."""
    return [h for h in history if h["iteration"] > since and (not has_loop or "time/loop_s" in h)]


def report_run(
    plan: Plan, measured: Measured, events: list[dict], ran: list[dict], replanned: bool, reporter: Reporter
) -> dict[str, float]:
    """Print the end-of-run tables for the iterations `ran`; returns each device's busy share of them."""
    iteration_s = sum(h["time/iteration_s"] for h in ran) / len(ran)
    share = work_share({"traceEvents": events})  # as the plan counts a call: its own work
    port_s = {port: seconds * share.get(port, 1.0) for port, seconds in measured.port_s.items()}
    reporter.print(comparison_table(plan, port_s, measured.device_s, len(ran), iteration_s))
    for line in drift_notes(plan, port_s, len(ran), replanned):
        reporter.print(line)
    if measured.loop_busy_s:
        table, verdict = loop_table(plan, measured.loop_busy_s, measured.loop_s)
        reporter.print(table)
        reporter.print(verdict)
    wall_s = len(ran) * iteration_s
    return {device.name: s / wall_s for device, s in sorted(measured.device_s.items())} if wall_s else {}
