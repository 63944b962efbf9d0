"""Does the planner hold without being told the costs? Workloads with no declared costs, calibrated the way a
user's first run calibrates (m2flow measures the unknown ports in its first iterations, re-plans — trying a plan
at other batch sizes where a cost split it could not measure decides — and caches what it measured), then every
candidate plan run side by side: its prediction from the cached costs beside its measured iteration time, and
where auto's choice ranks.

    python benchmarks/planner_accuracy.py [--workloads main camera metaworld spin-per-call] [--iterations 5]
        [--calibration-iterations 9] [--colocate auto true false] [--rounds 1]

`--colocate` runs each candidate under each `placement.colocate` given (a layout already run is not run again):
co-hosted replicas and a process per replica side by side. `--rounds N` runs every candidate N times, each round
in the other order, and takes the median of its runs as its measured time (on the 2-core machine the camera
workload's shared S=1 measured 1.7 s in its calibrating run and 1.80 s as a candidate, one sweep: dec06d).

Last line: `planner accuracy: auto best-or-within-5% in K/N, predictions within 10% in P/Q`.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from results_io import save_result

import m2flow as mf
from m2flow.cluster import Cluster
from m2flow.errors import M2FlowError, PlanError, SpecError
from m2flow.graph import build_graph
from m2flow.planners import make_plan
from m2flow.runtime.replan import REPLAN_AFTER, TRIAL_LEFT
from m2flow.schedule import Plan

ROOT = Path(__file__).resolve().parent.parent
WITHIN = 0.10  # a prediction this close to the measured iteration counts as right
NEAR_BEST = 0.05  # auto's choice this close to the measured fastest counts as right


@dataclass(frozen=True)
class Workload:
    config: str
    overrides: tuple[str, ...]
    declared: str  # what the workload declares about its costs


CPU = ("cluster.gpus=0",)
VIT = [
    f"workers.{key}.{field}"
    for key in ("env.args.evaluation.policy", "rollout.args", "actor.args")
    for field in ("model=vit", "size=10m", "patch=12")
]
WORKLOADS = {
    "main": Workload("ppo_mujoco.yaml", ("flow.loop.horizon=128", *CPU), "nothing"),
    "camera": Workload(
        "ppo_camera.yaml",
        ("workers.env.replicas=2", "workers.env.args.num_envs=8", "flow.loop.horizon=32", *CPU),
        "nothing",
    ),
    "metaworld": Workload(
        "ppo_metaworld_camera.yaml", ("workers.env.replicas=2", "flow.loop.horizon=16", *CPU), "nothing"
    ),
    # a policy whose cost is mostly per call: slicing the batch does not make it cheaper
    "spin-per-call": Workload(
        "spin_balanced.yaml",
        ("workers.policy.args.fixed_s=0.003", "workers.policy.args.per_env_s=0.0001", "flow.loop.horizon=64", *CPU),
        "nothing (the spin workers' true costs are not declared)",
    ),
    # on a GPU machine: camera simulators on the cores, a ViT policy's inference and training on the GPU
    "camera-vit-gpu": Workload(
        "ppo_camera.yaml",
        (
            "workers.env.replicas=8",
            "workers.env.args.num_envs=8",
            "flow.loop.horizon=64",
            "workers.env.args.video.save=false",
            *VIT,
        ),
        "nothing",
    ),
}
CPU_WORKLOADS = ["main", "camera", "metaworld", "spin-per-call"]


def spec_of(workload: Workload, out: Path, *extra: str) -> mf.WorkflowSpec:
    base = ("run.progress=false", "run.checkpoint_every=0", f"run.output_dir={out}")
    return mf.load_spec(ROOT / "configs" / workload.config, [*workload.overrides, *base, *extra])


def measured_iteration_s(result) -> float:
    """Median iteration time once the plan runs warm (the first iteration of each plan is left out)."""
    return statistics.median(h["time/iteration_s"] for h in result.history[1:])


def kept_run(spec: mf.WorkflowSpec, keep: Path, label: str) -> Path:
    """Where a failed run's folder (the ranks' stacks, failures.jsonl) is copied for a look: `keep`, beside the
    results, as `failed-<workflow>-<label>`."""
    run_dir = Path(spec.run.output_dir) / spec.name
    kept = keep / f"failed-{run_dir.name}-{label}"
    shutil.rmtree(kept, ignore_errors=True)  # an earlier sweep's, into the same folder
    if run_dir.exists():
        shutil.copytree(run_dir, kept, ignore=shutil.ignore_patterns("checkpoints", "*.mp4"))
    return kept


def failed_row(mode: str, stages: int, planned: Plan, exc: M2FlowError, spec: mf.WorkflowSpec, keep: Path) -> dict:
    """A candidate whose run failed: its error, and where its run folder is kept (`kept_run`)."""
    kept = kept_run(spec, keep, f"{mode}-S{stages}" + ("-co-hosted" if planned.processes else ""))
    return {
        "mode": mode,
        "stages": stages,
        "predicted_s": planned.predicted.iteration_s,
        "failed": str(exc),
        "co_hosted": bool(planned.processes),
        "kept": str(kept),
    }


@dataclass(frozen=True)
class Candidate:
    """A layout of a workload to run: its settings' label, the spec that runs it, and whether auto chose it."""

    mode: str
    stages: int
    label: str
    co_hosted: bool
    spec: mf.WorkflowSpec
    is_auto: bool


def candidates(
    workload: Workload, iterations: int, colocate: list[str], out: Path, cluster: Cluster
) -> list[Candidate]:
    """Every feasible layout (mode x stages x colocate setting), each once, auto's choice marked."""
    auto = make_plan(build_graph(spec_of(workload, out, "placement.pipeline_stages=auto")), cluster, mode="auto")
    found, seen = [], set()  # layouts planned: another colocate setting may plan the same
    for mode, stages, hosting in itertools.product(("shared", "hybrid", "disaggregated"), (1, 2, 4), colocate):
        settings = [f"placement.mode={mode}", f"placement.pipeline_stages={stages}", f"placement.colocate={hosting}"]
        try:
            planned = make_plan(build_graph(spec_of(workload, out, *settings)), cluster)
        except (PlanError, SpecError):
            continue  # infeasible here (devices, envs per slice)
        layout = (planned.mode, stages, str(planned.placements), str(planned.processes))
        if layout in seen:
            continue
        seen.add(layout)
        label = f"{mode} S={stages}" + (" co-hosted" if planned.processes else "")
        run_spec = spec_of(workload, out, *settings, f"run.iterations={iterations}", "placement.replan=false")
        is_auto = layout == (auto.mode, auto.pipeline_stages, str(auto.placements), str(auto.processes))
        found.append(Candidate(mode, stages, label, bool(planned.processes), run_spec, is_auto))
    return found


def bench(
    name: str,
    workload: Workload,
    iterations: int,
    calibrating: int,
    colocate: list[str],
    out: Path,
    keep: Path,
    rounds: int = 1,
) -> dict:
    """Calibrate `workload`, then run each candidate `rounds` times, each round in the other order (a drift of the
    machine's speed evens out). A candidate's prediction is its plan's as it starts its first round, from the cache
    as the calibration and the runs before it left it (its own runs not yet in it); its measured time is the median
    of its rounds."""
    calibrating_spec = spec_of(workload, out, f"run.iterations={calibrating}", "placement.mode=auto")
    try:
        calibration = mf.run(calibrating_spec)
    except M2FlowError as exc:  # the workload's failure is recorded, not the sweep's end: no candidate ran
        kept = kept_run(calibrating_spec, keep, "calibrating")
        print(f"  {name:14s} calibrating run FAILED: {str(exc).splitlines()[0][:300]}", flush=True)
        return {
            "workload": name,
            "declared": workload.declared,
            "calibration": {"iterations": calibrating, "failed": str(exc), "kept": str(kept)},
            "rows": [],
            "auto_within_5pct": False,
            "auto_vs_fastest": None,
        }
    cluster = Cluster.from_spec(calibrating_spec.cluster)
    runs = candidates(workload, iterations, colocate, out, cluster)
    predicted: list[list[float]] = [[] for _ in runs]  # per candidate, its plan's prediction as each round starts it
    measured: list[list[float]] = [[] for _ in runs]
    failures: dict[int, dict] = {}
    order = list(range(len(runs)))
    for round_ in range(rounds):
        for i in order if round_ % 2 == 0 else order[::-1]:
            c = runs[i]
            if i in failures:
                continue
            planned = make_plan(build_graph(c.spec), cluster)  # as the run plans it: from the cache as it is now
            predicted[i].append(planned.predicted.iteration_s)
            try:
                run = mf.run(c.spec)
            except M2FlowError as exc:  # one candidate's failure is recorded, not the sweep's end
                failures[i] = {**failed_row(c.mode, c.stages, planned, exc, c.spec, keep), "rounds_s": measured[i]}
                print(
                    f"  {name:14s} {c.label:24s}  FAILED in round {round_ + 1}: {str(exc).splitlines()[0][:300]}",
                    flush=True,
                )
                continue
            measured[i].append(measured_iteration_s(run))
            error = measured[i][-1] / predicted[i][-1] - 1
            print(
                f"  {name:14s} {c.label:24s}  predicted {predicted[i][-1]:7.3f} s"
                f"  measured {measured[i][-1]:7.3f} s  ({error:+.1%}){'  <- auto' if c.is_auto else ''}"
                + (f"  (round {round_ + 1})" if rounds > 1 else ""),
                flush=True,
            )
    rows = []
    for i, c in enumerate(runs):
        if i in failures:
            rows.append({**failures[i], "auto": c.is_auto})
            continue
        median = statistics.median(measured[i])
        rows.append(
            {
                "mode": c.mode,
                "stages": c.stages,
                "predicted_s": predicted[i][0],
                "rounds_predicted_s": predicted[i],
                "measured_s": median,
                "rounds_s": measured[i],
                "error": median / predicted[i][0] - 1,
                "co_hosted": c.co_hosted,
                "auto": c.is_auto,
            }
        )
    ran = [r for r in rows if "measured_s" in r]
    fastest = min((r["measured_s"] for r in ran), default=None)
    chosen = next((r for r in ran if r["auto"]), None)
    return {
        "workload": name,
        "declared": workload.declared,
        "calibration": {
            "iterations": calibrating,
            "replans": [note for note in calibration.plan.notes if note.startswith("replan:")],
            "plan": f"{calibration.plan.mode} S={calibration.plan.pipeline_stages}",
            "sources": sorted(set(calibration.plan.predicted.cost_sources.values())),
        },
        "rows": rows,
        "auto_within_5pct": chosen is not None and chosen["measured_s"] <= fastest * (1 + NEAR_BEST),
        "auto_vs_fastest": chosen["measured_s"] / fastest if chosen else None,
    }


def at_least_one(text: str) -> int:
    """`--rounds`: a count of one or more."""
    count = int(text)
    if count < 1:
        raise argparse.ArgumentTypeError(f"{count}: at least one round")
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", nargs="+", default=CPU_WORKLOADS, choices=list(WORKLOADS))
    parser.add_argument("--iterations", type=int, default=5, help="each candidate's run")
    parser.add_argument(
        "--calibration-iterations",
        type=int,
        default=REPLAN_AFTER + TRIAL_LEFT,
        help="the calibrating run's: long enough by default to try a plan at other batch sizes (a trial)",
    )
    parser.add_argument(
        "--colocate", nargs="+", default=["auto"], choices=["auto", "true", "false"], help="placement.colocate values"
    )
    parser.add_argument(
        "--rounds",
        type=at_least_one,
        default=1,
        help="runs of each candidate, in alternating order: its median is measured",
    )
    parser.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    args = parser.parse_args()
    keep = Path(args.out or ROOT / "benchmarks" / "results")  # a failed candidate's run folder goes beside it
    with tempfile.TemporaryDirectory(prefix="m2flow-accuracy-") as tmp:
        os.environ["M2FLOW_COST_CACHE"] = str(Path(tmp) / "cost-cache")  # start knowing nothing
        results = [
            bench(
                name,
                WORKLOADS[name],
                args.iterations,
                args.calibration_iterations,
                args.colocate,
                Path(tmp),
                keep,
                args.rounds,
            )
            for name in args.workloads
        ]
    predictions = [r for w in results for r in w["rows"] if "measured_s" in r]
    within = sum(abs(r["error"]) <= WITHIN for r in predictions)
    best = sum(w["auto_within_5pct"] for w in results)
    failed = sum("failed" in r for w in results for r in w["rows"])
    uncalibrated = sum("failed" in w["calibration"] for w in results)  # counted among auto's misses
    summary = (
        f"planner accuracy: auto best-or-within-5% in {best}/{len(results)},"
        f" predictions within 10% in {within}/{len(predictions)}"
        + (f", {failed} run(s) failed" if failed else "")
        + (f", {uncalibrated} calibrating run(s) failed (a miss each)" if uncalibrated else "")
    )
    save_result(
        "planner_accuracy", {"args": vars(args), "workloads": results, "summary": summary}, *filter(None, [args.out])
    )
    print(summary)


if __name__ == "__main__":
    main()
