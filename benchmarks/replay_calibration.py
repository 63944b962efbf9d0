"""A GPU sweep's calibration replayed on this machine: what the planner at this commit predicts for each candidate
from the calibrating run's own trace, beside what each candidate measured in that sweep.

`planner_accuracy.py --keep-traces` (`gpu_session.sh accuracy` with TRACES=1) keeps every run's trace; the
calibrating run's is what auto's choice came from (a fresh cost cache; each candidate's own prediction in the sweep
also read what the candidates run before it measured). Refitting it here, at another commit, shows what a change of
the fit or the cost model would have predicted and chosen on the same measurements, without a GPU: the candidates'
measured times are the sweep's own.

    python benchmarks/replay_calibration.py benchmarks/results/gpu44 [--gpus 1 --cpus 16] [--trial shared-S1-round1]

`--trial <label>`: another kept run of the sweep replayed after the calibration as a re-plan's trial would have run
it (its first iteration a warm-up), as if the calibrating run had tried that plan: what the planner predicts once it
measured both. Each run's loop calls are marked beside rendering as the running plan would have marked them
(`planners/render.py`; traces from before that mark carry none), and where the workers started again (a re-plan's
switch) is a warm-up, left out of the costs, as the trace marks it (`Trace.started`; traces from before that mark
have none: gpu49's calibrating run switched at iteration 3 unmarked, so its replay is not its run's refit).

Writes `<sweep>/replay_calibration.json` and ends with
`replay of gpu44: auto hybrid S=1, +2.3% over the fastest measured; predictions within 10% in 6/6`.
"""

from __future__ import annotations

import argparse
import json
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from planner_accuracy import NEAR_BEST, WITHIN, WORKLOADS, cache_at, spec_of
from results_io import save_result

from m2flow.graph import MacroGraph, build_graph
from m2flow.planners import make_plan
from m2flow.planners.cache import save_calibration
from m2flow.planners.render import ReplicaPort, beside_rendering
from m2flow.planners.trace_calls import started_at, traced_replica
from m2flow.runtime.executor import planned_graph
from m2flow.runtime.replan import Running, refit
from m2flow.schedule import Plan
from m2flow.spec import WorkflowSpec

CALIBRATING = "calibrating"  # the calibrating run's folder in the traces: <workflow>-calibrating


TRIAL_START = 1000  # a replayed trial's first iteration: after the calibrating run's


class KeptRun(NamedTuple):
    """One run of a sweep as its kept trace has it: the plan it ran, that plan's graph, its traced events."""

    plan: Plan
    graph: MacroGraph
    events: list[dict]


@contextmanager
def unpacked(sweep: Path) -> Iterator[Path]:
    """A temporary folder holding the sweep's kept runs under `traces/`, and an empty cost cache in use."""
    with tempfile.TemporaryDirectory(prefix="m2flow-replay-") as tmp, cache_at(Path(tmp) / "cost-cache"):
        with tarfile.open(sweep / "traces.tgz") as archive:
            archive.extractall(tmp, filter="data")
        yield Path(tmp)


def kept_run(folder: Path, spec: WorkflowSpec) -> KeptRun:
    """The run kept in `folder` (`<workflow>-<label>`) of the workflow `spec` declares."""
    plan = Plan.load(folder / "plan.json")
    graph = planned_graph(spec, plan) if plan.spec_overrides else build_graph(spec)
    return KeptRun(plan, graph, json.loads((folder / "trace.json").read_text())["traceEvents"])


def replay(sweep: Path, gpus: int, cpus: int, trial: str | None = None) -> dict:
    """The sweep's workload planned again on the costs its calibrating run's trace gives at this commit (and the run
    labelled `trial`'s after it)."""
    accuracy = json.loads((sweep / "planner_accuracy.json").read_text())
    (measured,) = accuracy["workloads"]
    workload = WORKLOADS[measured["workload"]]
    hardware = (f"cluster.gpus={gpus}", f"cluster.cpus={cpus}")
    with unpacked(sweep) as tmp:
        spec = spec_of(workload, tmp, "placement.mode=auto", "placement.pipeline_stages=auto", *hardware)
        (calibrating,) = Path(tmp, "traces").glob(f"*-{CALIBRATING}")
        first = kept_run(calibrating, spec)
        events = marked(first)
        cluster = first.plan.cluster  # as the sweep's machine had it (its memory too)
        # each start of the workers (a re-plan's switch to its trial, a restart) warmed up; a synchronous flow's run
        # measures from its last (an asynchronous one's from its re-plan, which no mark says: not replayed here)
        starts = [start.iteration for start in started_at(first.events)] or [0]
        running = Running(first.plan, starts[-1], tuple(starts))
        if trial is not None:
            # what the calibrating run cached of its plan's messages (and the controller), as the trial's run read it
            save_calibration(first.graph, refit(first.graph, cluster, events, running).calibrated)
            (tried,) = Path(tmp, "traces").glob(f"*-{trial}")
            then = kept_run(tried, spec)
            restarts = [TRIAL_START + start.iteration for start in started_at(then.events)] or [TRIAL_START]
            running = Running(then.plan, restarts[-1], (*starts, *restarts))
            events += [later(event, TRIAL_START) for event in marked(then)]
        profile = refit(first.graph, cluster, events, running).profile

        def planned(*settings: str) -> Plan:
            return make_plan(build_graph(spec_of(workload, tmp, *settings, *hardware)), cluster, profile)

        auto = planned(*workload.allocated, "placement.pipeline_stages=auto")  # auto as the sweep planned it
        rows = []
        for row in measured["rows"]:
            if "measured_s" not in row or row.get("variant"):
                continue  # failed; or another replica count or a hand layout, whose settings the row does not hold
            again = planned(f"placement.mode={row['mode']}", f"placement.pipeline_stages={row['stages']}")
            predicted = again.predicted.iteration_s
            rows.append(
                {
                    "mode": row["mode"],
                    "stages": row["stages"],
                    "predicted_s": predicted,
                    "measured_s": row["measured_s"],
                    "error": row["measured_s"] / predicted - 1,
                    "sweep_predicted_s": row["predicted_s"],
                    "auto": again.layout_key == auto.layout_key,
                }
            )
    fastest = min(r["measured_s"] for r in rows)
    chosen = next((r for r in rows if r["auto"]), None)
    within = sum(abs(r["error"]) <= WITHIN for r in rows)
    over = chosen["measured_s"] / fastest - 1 if chosen else None
    summary = (
        f"replay of {sweep.name}"
        + (f" with a trial of {trial}" if trial else "")
        + f": auto {auto.label}"
        + (f", {over:+.1%} over the fastest measured" if chosen else ", a plan the sweep did not measure")
        + f"; predictions within 10% in {within}/{len(rows)}"
    )
    return {
        "sweep": sweep.name,
        "sweep_commit": accuracy["meta"]["commit"],
        "trial": trial,
        "workload": measured["workload"],
        "rows": rows,
        "auto": auto.label,
        "auto_within_5pct": chosen is not None and over <= NEAR_BEST,
        "summary": summary,
    }


def marked(run: KeptRun) -> list[dict]:
    """The run's events, its loop calls beside rendering marked so, as the controller marks them now: as it marked
    them, where it marked where the workers started too (`Trace.started`: the plan may have changed since), else as
    the kept plan runs them."""
    if started_at(run.events):
        return run.events
    beside = beside_rendering(run.graph, run.plan.placements, run.plan.pipeline_stages, run.plan.cluster)
    return [
        {**event, "args": {**event["args"], "beside_rendering": True}}
        if event.get("cat") == "loop"
        and event.get("ph") == "X"
        and ReplicaPort(traced_replica(event), event["name"]) in beside
        else event
        for event in run.events
    ]


def later(event: dict, iterations: int) -> dict:
    """`event` as if its run had begun `iterations` iterations later."""
    if "iteration" not in event.get("args", {}):
        return event
    return {**event, "args": {**event["args"], "iteration": event["args"]["iteration"] + iterations}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("sweep", type=Path, help="a sweep's results folder holding planner_accuracy.json, traces.tgz")
    parser.add_argument("--gpus", type=int, default=1, help="the GPUs of the machine the sweep ran on")
    parser.add_argument("--cpus", type=int, default=16, help="its cores")
    parser.add_argument("--trial", default=None, help="a kept run's label, replayed as a trial after the calibration")
    args = parser.parse_args()
    result = replay(args.sweep, args.gpus, args.cpus, args.trial)
    for row in result["rows"]:
        print(
            f"  {row['mode']:8s} S={row['stages']}  predicted {row['predicted_s']:.3f} s (in the sweep"
            f" {row['sweep_predicted_s']:.3f})  measured {row['measured_s']:.3f} s  ({row['error']:+.1%})"
            + ("  <- auto" if row["auto"] else "")
        )
    save_result("replay_calibration" + (f"_trial_{args.trial}" if args.trial else ""), result, args.sweep)
    print(result["summary"])


if __name__ == "__main__":
    main()
