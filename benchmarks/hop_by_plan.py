"""What a message between two processes costs per item it carries, as each plan's own run calibrates it.

A loop message between processes costs a hop per message (`m2flow profile`'s, or 0.1 ms) plus a part per item it
carries (an env's observation, action, reward). After a run, the re-planner fits the part per item so that the
loop it predicts from the run's own port costs takes what the loop measured (`replan.calibrate_run`); that value
then prices the messages of every plan the next runs weigh that no run measured the messages of (since a3417aa a
plan run before is priced at its own runs' value), at their own slices' sizes. This runs a workload's
calibrating run, then each candidate plan (shared and hybrid, 1, 2 and 4 stages, a process per replica and
co-hosted) from the costs the calibration cached, and reads the per-item hop that candidate's own run calibrated:
where it differs from plan to plan, plans predicted with the calibrating plan's are off by the difference times
the items their messages carry.

    python benchmarks/hop_by_plan.py [--workloads main camera] [--iterations 5] [--out benchmarks/results]

Ends with `hop by plan: main 22.31-63.99 us per item (calibrating plan 23.16 us per item), camera ...`.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import tempfile
from pathlib import Path

from planner_accuracy import WORKLOADS, Workload, measured_iteration_s, spec_of
from results_io import save_result

import m2flow as mf
from m2flow.cluster import Cluster
from m2flow.errors import M2FlowError, PlanError, SpecError
from m2flow.graph import MacroGraph, build_graph
from m2flow.planners import make_plan
from m2flow.planners.cache import load_calibration, workflow_key
from m2flow.schedule import Plan

CACHE_ENV = "M2FLOW_COST_CACHE"


def bench(name: str, workload: Workload, iterations: int, calibrating: int, out: Path) -> dict:
    """The calibrating run's hop, then each candidate's own, each candidate run from the port costs the calibration
    cached and without its calibrated hop (so that the hop the cache holds after the run is that run's alone)."""
    calibrated = out / "cache" / name
    os.environ[CACHE_ENV] = str(calibrated)
    calibrating_spec = spec_of(workload, out, f"run.iterations={calibrating}", "placement.mode=auto")
    calibration = mf.run(calibrating_spec)
    plan = calibration.plan
    rows = [row_of(plan, "calibrating run", load_calibration(build_graph(calibrating_spec)), calibration)]
    print(f"  {name:8s} {rows[0]['plan']:36s} hop {_us(rows[0]['hop_item_us'])}", flush=True)
    cluster = Cluster.from_spec(calibrating_spec.cluster)
    for mode, stages, colocate in itertools.product(("shared", "hybrid"), (1, 2, 4), ("false", "true")):
        settings = [f"placement.mode={mode}", f"placement.pipeline_stages={stages}", f"placement.colocate={colocate}"]
        spec = spec_of(workload, out, *settings, f"run.iterations={iterations}", "placement.replan=false")
        graph = build_graph(spec)
        copy = out / "cache" / f"{name}-{mode}-{stages}-{colocate}"
        os.environ[CACHE_ENV] = str(candidate_cache(calibrated, copy, graph))
        try:
            planned = make_plan(graph, cluster)
        except (PlanError, SpecError):
            continue  # infeasible here
        if colocate == "true" and not planned.processes:
            continue  # nothing to co-host: the row before
        try:
            run = mf.run(spec)
        except M2FlowError as exc:  # the plan's failure is recorded, not the sweep's end
            rows.append({"role": "candidate", "plan": planned.label, "hop_item_us": None, "failed": str(exc)})
            print(f"  {name:8s} {rows[-1]['plan']:36s} FAILED: {str(exc).splitlines()[0][:300]}", flush=True)
            continue
        rows.append(row_of(planned, "candidate", load_calibration(graph), run))
        print(f"  {name:8s} {rows[-1]['plan']:36s} hop {_us(rows[-1]['hop_item_us'])}", flush=True)
    return {"workload": name, "rows": rows}


def candidate_cache(calibrated: Path, copy: Path, graph: MacroGraph) -> Path:
    """A copy of the cache the calibration left, for one candidate's run: its port costs, not the workflow's
    calibrated hop and controller time (`planners.cache.save_calibration`), which the run then calibrates alone."""
    shutil.rmtree(copy, ignore_errors=True)
    if calibrated.exists():
        shutil.copytree(calibrated, copy)
    else:  # the calibrating run cached nothing
        copy.mkdir(parents=True)
    (copy / f"{workflow_key(graph)}.json").unlink(missing_ok=True)
    return copy


def row_of(plan: Plan, role: str, calibration: dict[str, float], result) -> dict:
    hop = calibration.get("hop_item_s")  # none: the loop sent no message between processes, or the trace said none
    return {
        "role": role,
        "plan": plan.label,
        "hop_item_us": None if hop is None else 1e6 * hop,
        "measured_s": measured_iteration_s(result),
    }


def summary_of(result: dict) -> str:
    """A workload's hops in the summary line: their range, the calibrating plan's, and how many plans said none."""
    hops = [r["hop_item_us"] for r in result["rows"] if r["hop_item_us"] is not None]
    if not hops:
        return f"{result['workload']} none measured"
    unmeasured = sum(r["hop_item_us"] is None and "failed" not in r for r in result["rows"])
    none_in = f"; none in {unmeasured} plan(s)" if unmeasured else ""
    calibrating = _us(result["rows"][0]["hop_item_us"])
    return f"{result['workload']} {min(hops):.2f}-{max(hops):.2f} us per item (calibrating plan {calibrating}{none_in})"


def _us(value: float | None) -> str:
    return "none" if value is None else f"{value:.2f} us per item"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", nargs="+", choices=["main", "camera", "metaworld"], default=["main", "camera"])
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--calibration-iterations", type=int, default=9)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="m2flow-hops-") as tmp:
        results = [
            bench(name, WORKLOADS[name], args.iterations, args.calibration_iterations, Path(tmp))
            for name in args.workloads
        ]
    line = "hop by plan: " + ", ".join(summary_of(result) for result in results)
    save_result("hop_by_plan", {"args": vars(args), "workloads": results, "summary": line}, Path(args.out))
    print(line)


if __name__ == "__main__":
    main()
