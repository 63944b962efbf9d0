"""Does the cost cache guess the next run better from the median of the last runs than from the last run alone?

One workload and one plan run `--runs` times on this machine, each with a cost cache of its own, so that each
run's measured costs (its port fits, message hop and controller time) are kept apart. Then, for every run after
the first, the plan it ran is predicted from a cache that holds the runs before it, kept two ways: as m2flow
keeps it (at each batch size the median of the latest `RUNS_KEPT` runs) and with the latest run only
(`RUNS_KEPT = 1`, what the cache kept before). Both predictions stand beside the iteration the run measured.

`--disturbed 3 7` runs those runs beside `--hogs` processes that spin on the cores (another user's job on a shared
machine, or a test suite started beside the run): what such a run caches is what the next runs are predicted
from. A disturbed run's own row is shown and not scored (no cache can know of the spinning processes).

    python benchmarks/cost_cache.py [--workloads main camera] [--runs 10] [--iterations 5]
        [--mode shared] [--stages 2] [--disturbed 3 7] [--hogs 2]

Last line (undisturbed runs): `cost cache: median of the last 5 runs within 10% in A/N (mean |error| X%), the last
run within 10% in B/N (Y%)`.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from contextlib import contextmanager, nullcontext
from pathlib import Path

from planner_accuracy import WITHIN, WORKLOADS, cache_at, measured_iteration_s, spec_of
from results_io import save_result

import m2flow as mf
from m2flow.cluster import Cluster
from m2flow.graph import build_graph
from m2flow.planners import cache as cost_cache
from m2flow.planners import device_kinds, profile_of
from m2flow.planners.simulate import simulate_plan
from m2flow.runtime.executor import planned_graph

POLICIES = {"median": cost_cache.RUNS_KEPT, "last run": 1}  # runs kept per batch size


@contextmanager
def beside_hogs(count: int):
    """`count` processes spinning on the cores for the calls inside."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait(timeout=10)


def replayed(graph, cluster, runs: list[Path], kept: int, folder: Path) -> None:
    """Save each run's own measurements, in order, into a cache at `folder` that keeps `kept` runs a size."""
    kinds = device_kinds(graph, cluster)
    for i, own in enumerate(runs):
        with cache_at(own):
            fitted = {port: cached.fit for port, cached in cost_cache.cached_fits(graph, kinds).items()}
            calibration = cost_cache.load_calibration(graph)
        with cache_at(folder):
            cost_cache.save_cached(graph, kinds, fitted, run=f"run {i}", runs_kept=kept)
            cost_cache.save_calibration(graph, calibration, run=f"run {i}", runs_kept=kept)


def bench(name: str, args: argparse.Namespace, tmp: Path) -> dict:
    workload = WORKLOADS[name]
    settings = [
        f"placement.mode={args.mode}",
        f"placement.pipeline_stages={args.stages}",
        "placement.replan=false",
        f"run.iterations={args.iterations}",
    ]
    spec = spec_of(workload, tmp, *settings)
    graph, cluster = build_graph(spec), Cluster.from_spec(spec.cluster)
    own_caches, ran = [], []
    for i in range(args.runs):
        own = tmp / name / f"run-{i}"
        with cache_at(own), beside_hogs(args.hogs) if i in args.disturbed else nullcontext():
            result = mf.run(spec_of(workload, tmp, *settings))
        own_caches.append(own)
        ran.append((result.plan, measured_iteration_s(result)))
        print(f"  {name} run {i}: measured {ran[-1][1]:.3f} s{' (disturbed)' * (i in args.disturbed)}", flush=True)
    rows = []
    for i in range(1, args.runs):
        plan, measured = ran[i]
        row = {"run": i, "measured_s": measured, "disturbed": i in args.disturbed}
        runs_graph = planned_graph(spec, plan)
        for policy, kept in POLICIES.items():
            folder = tmp / name / f"replay-{kept}-{i}"
            replayed(graph, cluster, own_caches[:i], kept, folder)
            with cache_at(folder):
                predicted = simulate_plan(runs_graph, plan, profile_of(graph, cluster)).prediction.iteration_s
            row[policy] = {"predicted_s": predicted, "error": measured / predicted - 1}
        rows.append(row)
        print(
            f"  {name} run {i}{' (disturbed)' * row['disturbed']}: measured {measured:.3f} s, "
            + ", ".join(f"{p} predicted {row[p]['predicted_s']:.3f} s ({row[p]['error']:+.1%})" for p in POLICIES),
            flush=True,
        )
    return {"workload": name, "plan": f"{args.mode} S={args.stages}", "runs": args.runs, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", nargs="+", default=["main"], choices=list(WORKLOADS))
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--iterations", type=int, default=5, help="each run's")
    parser.add_argument("--mode", default="shared")
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--disturbed", nargs="*", type=int, default=[], help="runs made beside spinning processes")
    parser.add_argument("--hogs", type=int, default=1, help="spinning processes beside a disturbed run")
    parser.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="m2flow-cost-cache-") as tmp:
        results = [bench(name, args, Path(tmp)) for name in args.workloads]
    rows = [row for result in results for row in result["rows"] if not row["disturbed"]]
    parts = []
    for policy in POLICIES:
        errors = [abs(row[policy]["error"]) for row in rows]
        within = sum(error <= WITHIN for error in errors)
        parts.append(f"within {WITHIN:.0%} in {within}/{len(rows)} (mean |error| {statistics.mean(errors):.1%})")
    summary = f"cost cache: median of the last {POLICIES['median']} runs {parts[0]}, the last run {parts[1]}"
    save_result("cost_cache", {"args": vars(args), "workloads": results, "summary": summary}, *filter(None, [args.out]))
    print(summary)


if __name__ == "__main__":
    main()
