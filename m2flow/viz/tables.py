"""The dry run as text: placement, predicted phases and device use, ranked candidates."""

from __future__ import annotations

from rich.table import Table

from m2flow.plan import Plan


def placement_table(plan: Plan) -> Table:
    table = Table(title=f"placement: {plan.mode}, {plan.pipeline_stages} pipeline stage(s)")
    for column in ("worker", "devices", "replica -> device", "shares with"):
        table.add_column(column)
    shares: dict[str, list[str]] = {}
    for a, b in plan.sharing():
        shares.setdefault(a, []).append(b)
        shares.setdefault(b, []).append(a)
    for name, placement in plan.placements.items():
        devices = ", ".join(plan.device_name(d) for d in placement.devices)
        replicas = ", ".join(f"{r}:{plan.device_name(d)}" for r, d in enumerate(placement.replica_devices))
        table.add_row(name, devices, replicas, ", ".join(shares.get(name, [])) or "-")
    return table


def timeline_table(plan: Plan) -> Table:
    predicted = plan.predicted
    table = Table(
        title=f"predicted iteration: {predicted['iteration_s']:.4g} s, {predicted['env_steps_per_s']:,.0f} env steps/s"
    )
    table.add_column("phase")
    table.add_column("seconds", justify="right")
    for phase, seconds in predicted["phase_s"].items():
        table.add_row(phase, f"{seconds:.4g}")
    table.add_row("bubble fraction", f"{predicted['bubble_fraction']:.2f}")
    for device, busy in predicted["device_busy"].items():
        table.add_row(f"busy {device}", f"{busy:.0%}")
    return table


def candidates_table(plan: Plan) -> Table:
    table = Table(title="candidates (best first)")
    for column in ("mode", "stages", "s/iteration", "env steps/s", "bubble", "note"):
        table.add_column(column)
    for row in plan.candidates:
        if row["feasible"]:
            table.add_row(
                row["mode"],
                str(row["stages"]),
                f"{row['iteration_s']:.4g}",
                f"{row['env_steps_per_s']:,.0f}",
                f"{row['bubble_fraction']:.2f}",
                "chosen" if (row["mode"], row["stages"]) == (plan.mode, plan.pipeline_stages) else "",
            )
        else:
            table.add_row(row["mode"], "-", "-", "-", "-", f"infeasible: {row['reason']}")
    return table
