"""The dry run as text: placement, predicted phases and device use, ranked candidates."""

from __future__ import annotations

from rich.table import Table

from m2flow.cluster import DeviceId
from m2flow.planners.cache import CachedFit
from m2flow.schedule import DEFAULT_SOURCE, Plan, ReplicaId


def placement_table(plan: Plan) -> Table:
    table = Table(title=f"placement: {plan.mode}, {plan.pipeline_stages} pipeline stage(s)")
    for column in ("worker", "devices", "replica -> device", "shares with"):
        table.add_column(column)
    shares: dict[str, list[str]] = {}
    for a, b in plan.sharing():
        shares.setdefault(a, []).append(b)
        shares.setdefault(b, []).append(a)
    for name, placement in plan.placements.items():
        devices = ", ".join(d.name for d in placement.devices)
        replicas = ", ".join(f"{r}:{d.name}" for r, d in enumerate(placement.replica_devices))
        table.add_row(name, devices, replicas, ", ".join(shares.get(name, [])) or "-")
    return table


def timeline_table(plan: Plan) -> Table:
    predicted = plan.predicted
    table = Table(
        title=f"predicted iteration: {predicted.iteration_s:.4g} s, {predicted.env_steps_per_s:,.0f} env steps/s"
    )
    table.add_column("phase")
    table.add_column("seconds", justify="right")
    for phase, seconds in predicted.phase_s.items():
        table.add_row(phase, f"{seconds:.4g}")
    if predicted.hidden_s:
        table.add_row("hidden beside the loop", f"-{predicted.hidden_s:.4g}")
    table.add_row("bubble fraction", f"{predicted.bubble_fraction:.2f}")
    for device, busy in predicted.device_busy.items():
        table.add_row(f"busy {device.name}", f"{busy:.0%}")
    return table


SKIPPED = (
    "skipped: not simulated; no plan of the layout is under its floor (>=: its busiest loop replica's work, and"
    " in a synchronous flow its largest after-loop call), which is above the best plan found"
)


def candidates_table(plan: Plan) -> Table:
    """Feasible candidates ranked; the layouts skipped by their floor, with it; the infeasible ones with the
    reason, in the caption."""
    layouts = any(row.layout != "-" for row in plan.candidates) and any(
        row.layout != plan.candidates[0].layout for row in plan.candidates
    )
    table = Table(title="candidates (best first)")
    for column in (
        "mode",
        "stages",
        *(["sim procs x envs"] if layouts else []),
        "s/iteration",
        "env steps/s",
        "bubble",
        "",
    ):
        table.add_column(column)
    reasons = []
    for row in plan.candidates:
        layout = [row.layout] if layouts else []
        if row.feasible:
            chosen = row is plan.candidates[0]
            table.add_row(
                row.mode,
                str(row.stages),
                *layout,
                f"{row.iteration_s:.4g}",
                f"{row.env_steps_per_s:,.0f}",
                f"{row.bubble_fraction:.2f}",
                "chosen" if chosen else "",
            )
        elif row.floor_s is not None:
            table.add_row(row.mode, "-", *layout, f">= {row.floor_s:.4g}", "-", "-", "skipped")
            reasons.append(SKIPPED)
        else:
            table.add_row(row.mode, "-", *layout, "-", "-", "-", "infeasible")
            reasons.append(f"{row.mode}: {row.reason.split(': ', 1)[-1]}")
    table.caption = "\n".join(dict.fromkeys(reasons)) or None
    return table


def sources_line(sources: dict[str, str]) -> str:
    """Where the plan's costs came from, e.g. `costs: 9 measured, 2 declared, 4 default`."""
    counts: dict[str, int] = {}
    for key, source in sources.items():
        if not key.endswith(".memory"):
            counts[source] = counts.get(source, 0) + 1
    parts = ", ".join(f"{n} {source}" for source, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    hint = " (`m2flow run` measures them in its first iterations and re-plans)" if counts.get(DEFAULT_SOURCE) else ""
    return f"port costs: {parts}{hint}"


DRIFT = 0.25  # a port measured this far from its prediction is flagged


def off(measured: float, predicted: float) -> bool:
    return predicted > 0 and abs(measured / predicted - 1) > DRIFT


def drift_notes(plan: Plan, port_s: dict[str, float], iterations: int, calibrated: bool) -> list[str]:
    """A line per port measured more than 25% off its prediction: where its cost came from, and what was
    done about it."""
    notes = []
    sources = plan.predicted.cost_sources
    for port, want in sorted(plan.predicted.port_s.items()):
        got = port_s.get(port, 0.0) / max(1, iterations)
        if not off(got, want):
            continue
        source = sources.get(port, DEFAULT_SOURCE)
        if source == "declared":
            worker = port.split(".")[0]
            action = f"its cost is declared in workers.{worker}.profile: correct it, or remove it to let m2flow measure"
            if calibrated:
                action += " (the re-plan used the measured one)"
        elif calibrated:
            action = "the plan was re-planned on costs measured in this run; they are cached for the next runs"
        else:
            action = "what this run measured is cached: `m2flow plan` and the next run start from it"
        notes.append(f"drift: {port} took {got / want:.2f}x its predicted time (cost {source}); {action}")
    return notes


def comparison_table(
    plan: Plan, port_s: dict[str, float], device_s: dict[DeviceId, float], iterations: int, iteration_s: float
) -> Table:
    """Predicted vs measured seconds per iteration for every port, and busy fraction per device."""
    predicted = plan.predicted
    table = Table(
        title=f"predicted vs measured, per iteration (iteration: {predicted.iteration_s:.3g} s"
        f" predicted, {iteration_s:.3g} s measured)"
    )
    for column in ("port / device", "predicted", "measured", "measured/predicted"):
        table.add_column(column, justify="right" if column != "port / device" else "left")
    for port in sorted(set(predicted.port_s) | set(port_s)):
        want, got = predicted.port_s.get(port, 0.0), port_s.get(port, 0.0) / max(1, iterations)
        ratio = f"{got / want:.2f}x" + (" !" if off(got, want) else "") if want > 0 else "-"
        table.add_row(port, f"{want:.3g} s", f"{got:.3g} s", ratio)
    for device in sorted(set(predicted.device_busy) | set(device_s)):
        want = predicted.device_busy.get(device, 0.0)
        got = device_s.get(device, 0.0) / max(1e-9, iterations * iteration_s)
        table.add_row(f"busy {device.name}", f"{want:.0%}", f"{got:.0%}", f"{got / want:.2f}x" if want > 0 else "-")
    return table


def cached_costs_table(fits: dict[str, CachedFit]) -> Table:
    """The port costs the cache holds after this run, for the next runs and `m2flow plan`: `fixed_s + per_item_s *
    items`, the batch sizes and runs it was fitted across, its residual (how far the measured means or calls
    scatter around it) and, for a port called outside the loop, each replica's share of it at each replica count
    measured (`2: 2.00/0.00`; "even" where none was)."""
    table = Table(title="port costs cached for the next runs and `m2flow plan`")
    for column in ("port", "per call", "per item", "batch sizes", "runs", "residual", "replicas' shares"):
        table.add_column(column, justify="left" if column == "port" else "right")
    for port, cached in sorted(fits.items()):
        fit = cached.fit
        runs = len({row.run for row in cached.seen}) or 1
        sizes = ",".join(str(size) for size in fit.batch_sizes) or "-"
        table.add_row(
            port,
            f"{fit.fixed_s * 1e3:.3g} ms",
            f"{fit.per_item_s * 1e3:.3g} ms",
            sizes,
            str(runs),
            f"{fit.residual:.0%}",
            "; ".join(
                f"{count}: " + "/".join(f"{share:.2f}" for share in shares)
                for count, shares in sorted(fit.replica_shares.items())
            )
            or "even",
        )
    return table


def loop_table(plan: Plan, busy_s: dict[ReplicaId, dict[str, float]], loop_s: float) -> tuple[Table, str]:
    """Where the loop's time goes, replica by replica: each port's share of the loop's wall time and the
    rest, spent waiting on its input (or on the channels); and which replica bounds the loop."""
    table = Table(title=f"the loop, per replica (share of its {loop_s:.3g} s wall time over the measured iterations)")
    for column in ("replica", "device", "busy", "waiting"):
        table.add_column(column, justify="left" if column in ("replica", "device") else "right")
    share = {r: sum(ports.values()) / max(loop_s, 1e-9) for r, ports in busy_s.items()}
    for replica in sorted(busy_s, key=lambda r: (r.worker, r.replica)):
        ports = ", ".join(f"{port} {s / max(loop_s, 1e-9):.0%}" for port, s in sorted(busy_s[replica].items()))
        table.add_row(str(replica), plan.device_of(replica).name, ports, f"{max(0.0, 1 - share[replica]):.0%}")
    bound, idle = max(share, key=share.get), min(share, key=share.get)
    verdict = f"loop: bound by {bound} on {plan.device_of(bound).name} ({share[bound]:.0%} busy)"
    if idle != bound:
        verdict += f"; {idle} waits most ({max(0.0, 1 - share[idle]):.0%} of the loop)"
    return table, verdict
