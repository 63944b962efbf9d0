"""`make run`'s own table, run after run: the main job's prediction beside what it measured.

`make run` trains PPO on HalfCheetah (`configs/ppo_mujoco.yaml`, 196 iterations) and ends with a table of the
iteration's, each port's and each device's predicted and measured time (`report.json`, `RunResult.report`). This
runs that job as `make run` does, `--runs` times in a row from an empty cost cache: the first measures the costs
(its first iterations, then a re-plan), each next one plans from what the runs before it cached. Each run's
table is kept, with the median iteration beside the mean the table reports (an evaluation every 49 iterations
lengthens a few of them).

    python benchmarks/make_run_table.py [--runs 3] [--out benchmarks/results] [override ...]

Ends with `make run's table: iteration within 10% of its prediction in 3/3 runs (+3.9%, -0.7%, +1.1%)`.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from dataclasses import asdict
from pathlib import Path

from results_io import save_result

import m2flow as mf
from m2flow.config import load_spec
from m2flow.runtime.run_record import RunResult
from m2flow.runtime.run_report import RunReport
from m2flow.viz.tables import off

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "ppo_mujoco.yaml"
WITHIN = 0.10  # issue #13's target for `make run`'s table


def row_of(run: int, result: RunResult) -> dict:
    """One run's table: its plan, the iteration predicted beside the measured iterations' mean and median, and
    its phases, ports and devices as the report has them."""
    report: RunReport = result.report
    predicted_s = report.iteration_s.predicted
    return {
        "run": run,
        "plan": result.plan.label,
        "iterations": report.iterations,
        "predicted_s": predicted_s,
        "measured_s": report.iteration_s.measured,
        "median_s": report.median_iteration_s,
        "error": report.iteration_s.measured / predicted_s - 1,
        "phase_s": {phase: asdict(seconds) for phase, seconds in report.phase_s.items()},
        "port_s": {port: asdict(seconds) for port, seconds in report.port_s.items()},
        "device_busy": {device: asdict(busy) for device, busy in report.device_busy.items()},
        "ports_off": sorted(port for port, cost in report.port_s.items() if off(cost.measured, cost.predicted)),
    }


def summary_of(rows: list[dict]) -> str:
    """The summary line: how many runs' iterations came within `WITHIN` of their prediction, and each error."""
    within = sum(abs(row["error"]) <= WITHIN for row in rows)
    errors = ", ".join(f"{row['error']:+.1%}" for row in rows)
    return f"make run's table: iteration within {WITHIN:.0%} of its prediction in {within}/{len(rows)} runs ({errors})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--name", default="make_run_table")
    parser.add_argument("overrides", nargs="*", help="key=value, as `make run ARGS=...` takes them")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="m2flow-make-run-") as tmp:
        os.environ["M2FLOW_COST_CACHE"] = str(Path(tmp) / "cost-cache")  # a machine that has measured nothing
        spec = load_spec(CONFIG, [*args.overrides, f"run.output_dir={tmp}", "run.progress=false"])
        if spec.run.iterations < 2:
            parser.error("run.iterations: at least 2 (the first warms up; the table covers the iterations after it)")
        for run in range(1, args.runs + 1):
            rows.append(row_of(run, mf.run(spec)))
            row = rows[-1]
            print(
                f"  run {run}: {row['plan']}  predicted {row['predicted_s']:.3f} s  measured {row['measured_s']:.3f} s"
                f" (median {row['median_s']:.3f} s)  ({row['error']:+.1%}); ports off >25%: {row['ports_off']}",
                flush=True,
            )
    line = summary_of(rows)
    save_result(args.name, {"args": vars(args), "runs": rows, "summary": line}, Path(args.out))
    print(line)


if __name__ == "__main__":
    main()
