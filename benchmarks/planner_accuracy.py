"""Does the planner hold without being told the costs? Workloads with no declared costs, calibrated the way a
user's first run calibrates (m2flow measures the unknown ports in its first iterations, re-plans — trying a plan
at other batch sizes where a cost split it could not measure decides — and caches what it measured), then every
candidate plan run side by side (`candidate_settings`: every mode and stage count, each other replica count auto's
allocation weighs, an RLinf-style layout by hand): its prediction from the cached costs beside its measured
iteration time, and where auto's choice ranks. The calibrating run weighs every mode and stage count, as auto's
choice does, and a throwaway first run of each workload (`warmed_up`) comes before it: this process runs every run
of the sweep, and its first on the Ray cluster runs slower than the next ones.

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
import re
import shutil
import statistics
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from results_io import save_result

import m2flow as mf
from m2flow.cluster import Cluster
from m2flow.errors import M2FlowError, PlanError, SpecError
from m2flow.graph import build_graph
from m2flow.planners import make_plan
from m2flow.planners.allocation import Layout
from m2flow.planners.allocation import options as allocation_options
from m2flow.runtime.replan import REPLAN_AFTER, TRIAL_LEFT
from m2flow.schedule import Plan

ROOT = Path(__file__).resolve().parent.parent
WITHIN = 0.10  # a prediction this close to the measured iteration counts as right
NEAR_BEST = 0.05  # auto's choice this close to the measured fastest counts as right
WARM_UP_ITERATIONS = 5  # the throwaway first run's (`warmed_up`)
# auto as auto's choice weighs it: every mode and stage count, whatever the config fixes
AUTO_PLACEMENT = ("placement.mode=auto", "placement.pipeline_stages=auto")


@dataclass(frozen=True)
class Workload:
    """A config and its overrides; `allocated` lets the planner choose the simulator's replica count (auto weighs
    each count, and each is a candidate at auto's mode and stages for it); `hand_layouts`: RLinf-style layouts
    (`placement.devices` and stages), each a candidate beside auto's."""

    config: str
    overrides: tuple[str, ...]
    declared: str  # what the workload declares about its costs
    allocated: tuple[str, ...] = ()
    hand_layouts: tuple[tuple[str, ...], ...] = ()


def allocated(envs: int) -> tuple[str, ...]:
    """The simulator's `envs` split over as many processes as the planner chooses (`replicas: auto`)."""
    return ("workers.env.replicas=auto", f"workers.env.args.num_envs={envs}")


def by_hand(devices: str, stages: int) -> tuple[str, ...]:
    """An RLinf-style layout: workers pinned to device indices by hand, pipelined in `stages`."""
    return (f"placement.devices={devices}", f"placement.pipeline_stages={stages}")


# on the 2-core machine, as RLinf's disaggregated pipeline: the simulators on one core, inference and training on
# the other, two stages
SIMULATORS_APART = by_hand("{env: 0, rollout: 1, actor: 1}", 2)


CPU = ("cluster.gpus=0",)
VIT = [
    f"workers.{key}.{field}"
    for key in ("env.args.evaluation.policy", "rollout.args", "actor.args")
    for field in ("model=vit", "size=10m", "patch=12")
]
ON_GPU_CAMERA = (
    "workers.env.replicas=8",
    "workers.env.args.num_envs=8",
    "flow.loop.horizon=64",
    "workers.env.args.video.save=false",
)
WORKLOADS = {
    "main": Workload("ppo_mujoco.yaml", ("flow.loop.horizon=128", *CPU), "nothing", allocated(8), (SIMULATORS_APART,)),
    "camera": Workload(
        "ppo_camera.yaml",
        ("workers.env.replicas=2", "workers.env.args.num_envs=8", "flow.loop.horizon=32", *CPU),
        "nothing",
        allocated(16),
        (SIMULATORS_APART,),
    ),
    "metaworld": Workload(
        "ppo_metaworld_camera.yaml",
        ("workers.env.replicas=2", "flow.loop.horizon=16", *CPU),
        "nothing",
        allocated(16),
        (SIMULATORS_APART,),
    ),
    # a policy whose cost is mostly per call: slicing the batch does not make it cheaper
    "spin-per-call": Workload(
        "spin_balanced.yaml",
        ("workers.policy.args.fixed_s=0.003", "workers.policy.args.per_env_s=0.0001", "flow.loop.horizon=64", *CPU),
        "nothing (the spin workers' true costs are not declared)",
        allocated(8),
        (by_hand("{env: 0, policy: 1, trainer: 1}", 2),),
    ),
    # on a GPU machine: camera simulators on the cores, a ViT policy's inference and training on the GPU
    "camera-vit-gpu": Workload("ppo_camera.yaml", (*ON_GPU_CAMERA, *VIT), "nothing"),
    # the same with the config's own CNN policy: a model of another family, whose act calls cost little
    "camera-cnn-gpu": Workload("ppo_camera.yaml", ON_GPU_CAMERA, "nothing"),
}
CPU_WORKLOADS = ["main", "camera", "metaworld", "spin-per-call"]


@contextmanager
def cache_at(folder: Path):
    """Point the cost cache at `folder` for the calls inside."""
    before = os.environ.get("M2FLOW_COST_CACHE")
    os.environ["M2FLOW_COST_CACHE"] = str(folder)
    try:
        yield
    finally:
        if before is None:
            del os.environ["M2FLOW_COST_CACHE"]
        else:
            os.environ["M2FLOW_COST_CACHE"] = before


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


# what `--keep-traces` keeps of each run: its calls' times, its plan, where its processes ran, its metrics (a camera
# simulator's seconds of rendering and of physics, apart) and its end-of-run table
TRACE_FILES = ("trace.json", "plan.json", "processes.json", "metrics.jsonl", "report.json")


def keep_trace(spec: mf.WorkflowSpec, traces: Path | None, label: str) -> None:
    """Copy the run's `TRACE_FILES` to `traces/<workflow>-<label>/` (`--keep-traces`: a refit needs the calls'
    times, which the results JSON does not hold; `replay_calibration.py`)."""
    if traces is None:
        return
    run_dir = Path(spec.run.output_dir) / spec.name
    kept = traces / f"{run_dir.name}-{label}"
    kept.mkdir(parents=True, exist_ok=True)
    for name in TRACE_FILES:
        if (run_dir / name).exists():
            shutil.copy2(run_dir / name, kept / name)


def run_label(mode: str, stages: int, co_hosted: bool, variant: str = "") -> str:
    """A candidate's name in its kept folders: `hybrid-S2`, `shared-S1-co-hosted`, `shared-S1-env-1-x-16`,
    `manual-hybrid-S2-by-hand-env-0-rollout-1-actor-1`."""
    name = f"{mode} S{stages}" + (" co-hosted" if co_hosted else "") + (f" {variant}" if variant else "")
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-")


def failed_row(
    mode: str, stages: int, planned: Plan, exc: M2FlowError, spec: mf.WorkflowSpec, keep: Path, variant: str = ""
) -> dict:
    """A candidate whose run failed: its error, and where its run folder is kept (`kept_run`)."""
    kept = kept_run(spec, keep, run_label(mode, stages, bool(planned.processes), variant))
    return {
        "mode": mode,
        "stages": stages,
        "variant": variant,
        "predicted_s": planned.predicted.iteration_s,
        "failed": str(exc),
        "co_hosted": bool(planned.processes),
        "kept": str(kept),
    }


@dataclass
class Candidate:
    """A layout of a workload, as its first run planned it (label, co-hosting, auto's or not), and its runs: the
    prediction as each started, the iteration time each measured, its failure if one failed. `variant` names what
    sets it apart beyond its mode and stages: a replica count auto's search weighed, or a hand layout."""

    mode: str
    stages: int
    label: str
    co_hosted: bool
    spec: mf.WorkflowSpec
    is_auto: bool
    layout_key: tuple
    variant: str = ""
    predicted: list[float] = field(default_factory=list)
    measured: list[float] = field(default_factory=list)
    failed: dict | None = None
    relaid: bool = False  # a later run planned another layout than its first (co-hosting follows the costs)


def bench(
    name: str,
    workload: Workload,
    iterations: int,
    calibrating: int,
    colocate: list[str],
    out: Path,
    keep: Path,
    rounds: int = 1,
    traces: Path | None = None,
    warm_up: bool = True,
) -> dict:
    """Calibrate `workload`, then run every layout of it `rounds` times, each round in the other order (a drift of
    the machine's speed evens out). Each run is planned as it starts, from the cache as the calibration and the runs
    before it left it, as the run itself plans: a candidate's prediction, label and co-hosting are its first run's;
    its measured time is the median of its runs. With `traces`, every run's trace is kept there (`keep_trace`)."""
    calibrating_spec = spec_of(workload, out, f"run.iterations={calibrating}", *AUTO_PLACEMENT)
    try:
        if warm_up:
            warmed_up(workload, out)
        calibration = mf.run(calibrating_spec)
        keep_trace(calibrating_spec, traces, "calibrating")
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
    auto = make_plan(build_graph(spec_of(workload, out, *workload.allocated, *AUTO_PLACEMENT)), cluster)
    runs: list[Candidate] = []
    for variant, settings in candidate_settings(workload, out, cluster, colocate):
        spec = spec_of(workload, out, *settings, f"run.iterations={iterations}", "placement.replan=false")
        try:
            planned = make_plan(build_graph(spec), cluster)
        except (PlanError, SpecError):
            continue  # infeasible here (devices, envs per slice)
        if any(planned.layout_key == c.layout_key for c in runs):
            continue  # another setting planned a layout already run
        is_auto = planned.layout_key == auto.layout_key
        runs.append(
            Candidate(
                planned.mode,
                planned.pipeline_stages,
                planned.label + (f" ({variant})" if variant else ""),
                bool(planned.processes),
                spec,
                is_auto,
                planned.layout_key,
                variant,
            )
        )
        run_once(name, runs[-1], planned, keep, 0, rounds, traces)
    for round_ in range(1, rounds):
        for c in runs[::-1] if round_ % 2 else runs:
            if c.failed is None:
                planned = make_plan(build_graph(c.spec), cluster)
                c.relaid |= planned.layout_key != c.layout_key
                run_once(name, c, planned, keep, round_, rounds, traces)
    rows = []
    for c in runs:
        if c.failed is not None:
            rows.append({**c.failed, "auto": c.is_auto})
            continue
        median = statistics.median(c.measured)
        rows.append(
            {
                "mode": c.mode,
                "stages": c.stages,
                "variant": c.variant,
                "predicted_s": c.predicted[0],
                "rounds_predicted_s": c.predicted,
                "measured_s": median,
                "rounds_s": c.measured,
                "error": median / c.predicted[0] - 1,
                "co_hosted": c.co_hosted,
                "relaid": c.relaid,
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
            "plan": calibration.plan.label,
            "sources": sorted(set(calibration.plan.predicted.cost_sources.values())),
        },
        "rows": rows,
        "auto_within_5pct": chosen is not None and chosen["measured_s"] <= fastest * (1 + NEAR_BEST),
        "auto_vs_fastest": chosen["measured_s"] / fastest if chosen else None,
    }


def candidate_settings(
    workload: Workload, out: Path, cluster: Cluster, colocate: list[str]
) -> list[tuple[str, tuple[str, ...]]]:
    """Each candidate's settings and its variant (what sets it apart beyond mode and stages): every mode and stage
    count under each `placement.colocate` given, at the workload's replica counts; then every replica count auto's
    allocation search weighs (`Workload.allocated`: `planners/allocation.py`), each at the mode and stages auto plans
    for it now, from the cache auto's choice is planned from (the runs before its turn do not move it); then each
    hand layout."""
    settings = [
        ("", (f"placement.mode={mode}", f"placement.pipeline_stages={stages}", f"placement.colocate={hosting}"))
        for mode, stages, hosting in itertools.product(("shared", "hybrid", "disaggregated"), (1, 2, 4), colocate)
    ]
    if workload.allocated:
        graph = build_graph(spec_of(workload, out, *workload.allocated))
        for worker, counts in allocation_options(graph, cluster).items():
            for count in counts:
                layout = Layout.of({worker: count})
                try:
                    auto = make_plan(
                        build_graph(spec_of(workload, out, *layout.overrides(graph), *AUTO_PLACEMENT)), cluster
                    )
                except (PlanError, SpecError):
                    continue  # no plan of this count fits here
                pinned = (f"placement.mode={auto.mode}", f"placement.pipeline_stages={auto.pipeline_stages}")
                settings.append((layout.label(graph), (*layout.overrides(graph), *pinned)))
    for hand in workload.hand_layouts:
        devices = hand[0].partition("=")[2]
        settings.append((f"by hand: {devices.strip('{}')}", hand))
    return settings


def warmed_up(workload: Workload, out: Path) -> None:
    """Run `workload` once, what it measures kept in a cache of its own: this process's first run on its Ray cluster
    runs slower than the later ones (the main job's shared S=1 on the 2-core machine: medians 0.612 and 0.693 s
    against 0.547-0.622 s for the next two runs, two processes), which a user's runs, each its own process, all
    are alike. Without it the calibrating run alone runs so, and its costs price every plan high."""
    spec = spec_of(workload, out, f"run.iterations={WARM_UP_ITERATIONS}", "placement.replan=false")
    with tempfile.TemporaryDirectory(prefix="m2flow-warm-up-") as own, cache_at(Path(own)):
        mf.run(spec)


def run_once(
    name: str, c: Candidate, planned: Plan, keep: Path, round_: int, rounds: int, traces: Path | None = None
) -> None:
    """Run candidate `c` once, as `planned` (its plan as the run starts), and record what it measured or why it
    failed: a failed candidate is not run again, the sweep goes on."""
    c.predicted.append(planned.predicted.iteration_s)
    which = f"  (round {round_ + 1})" if rounds > 1 else ""
    try:
        run = mf.run(c.spec)
    except M2FlowError as exc:
        failure = failed_row(c.mode, c.stages, planned, exc, c.spec, keep, c.variant)
        c.failed = {**failure, "predicted_s": c.predicted[0], "rounds_predicted_s": c.predicted, "rounds_s": c.measured}
        c.failed["failed_round"] = round_ + 1
        print(f"  {name:14s} {c.label:24s}  FAILED{which}: {str(exc).splitlines()[0][:300]}", flush=True)
        return
    keep_trace(c.spec, traces, f"{run_label(c.mode, c.stages, c.co_hosted, c.variant)}-round{round_ + 1}")
    c.measured.append(measured_iteration_s(run))
    error = c.measured[-1] / c.predicted[-1] - 1
    print(
        f"  {name:14s} {c.label:24s}  predicted {c.predicted[-1]:7.3f} s  measured {c.measured[-1]:7.3f} s"
        f"  ({error:+.1%}){'  <- auto' if c.is_auto else ''}{which}",
        flush=True,
    )


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
    parser.add_argument("--keep-traces", action="store_true", help="keep each run's trace under <out>/traces/")
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
                keep / "traces" if args.keep_traces else None,
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
