"""Synchronous PPO against one-step-off (and k-off) PPO on the same workload, seeds and env-step budget:
env steps/s end to end, and deterministic evaluation return against env steps and wall time.

Each variant is `configs/ppo_mujoco.yaml` run by `learning.py`'s m2flow runner (evaluations every
`--eval-every` env steps, left out of the wall time); `k` adds `flow.async.max_staleness=k`, `--drop` a variant
with `flow.async.on_stale=drop` beside each k, and the planner places the workers for the flow it is given.
Each run also reports how busy each device was over its measured iterations (`busy`: the union of its
processes' work, so overlapping work counts once).

    python benchmarks/async.py [--env HalfCheetah-v5] [--steps 100000] [--seeds 1 2 3] [--staleness 1 2] [--drop]
        [--set KEY=VALUE ...]

Writes benchmarks/results/async_<env>.json and async_<env>.png. Last line:
`async: one-step-off/sync env steps/s: <x>x; return sync <mean> ± <std>, 1-off <mean> ± <std>, ... at <N> steps
(<k> seeds)`.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from learning import ALGOS, at, evaluation_grid, m2flow_run, plot, summarise
from results_io import RESULTS, save_result


@dataclass(frozen=True)
class Variant:
    staleness: int | None  # None: the synchronous flow
    drop: bool = False  # on_stale: drop

    @property
    def label(self) -> str:
        if self.staleness is None:
            return "sync"
        return f"{self.staleness}-off" + (" drop" if self.drop else "")

    @property
    def overrides(self) -> list[str]:
        if self.staleness is None:
            return []
        # asynchronous from the first iteration, as the recorded runs were (no synchronous calibration first)
        asynchronous = [f"flow.async.max_staleness={self.staleness}", "placement.replan=false"]
        return [*asynchronous, *(["flow.async.on_stale=drop"] if self.drop else [])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--eval-every", type=int, default=10_000)
    parser.add_argument("--staleness", type=int, nargs="+", default=[1], help="the k-off variants to run")
    parser.add_argument("--drop", action="store_true", help="each k-off also with on_stale: drop")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides for every variant")
    parser.add_argument("--name", help="the result's name (default async_<env>)")
    parser.add_argument("--out", default=str(RESULTS), help="the folder for the JSON and the plot")
    args = parser.parse_args()
    overlapped = [Variant(k, drop) for k in args.staleness for drop in ([False, True] if args.drop else [False])]
    variants = [Variant(None), *overlapped]
    runs, grid = [], evaluation_grid(args.env, args.eval_every, args.set, ALGOS["ppo"], None)
    with tempfile.TemporaryDirectory(prefix="m2flow-async-") as tmp:
        for seed in args.seeds:  # variants side by side per seed: drift in the machine hits them alike
            for variant in variants:
                overrides = [*args.set, *variant.overrides]
                run = m2flow_run(args.env, args.steps, seed, grid, Path(tmp), overrides, variant.label)
                runs.append(run)
                busy = ", ".join(f"{device} {share:.0%}" for device, share in run["busy"].items())
                print(
                    f"{variant.label} seed {seed}: {at(run['curve'], args.steps):.0f} at {args.steps} steps,"
                    f" {run['steps_per_s']:.0f} env steps/s ({run['trained_share']:.0%} trained); busy {busy}",
                    flush=True,
                )
    summary = summarise(runs, args.steps)
    for variant in overlapped:
        per_seed = [
            b["steps_per_s"] / a["steps_per_s"]
            for a, b in zip(
                [r for r in runs if r["implementation"] == "sync"],
                [r for r in runs if r["implementation"] == variant.label],
                strict=True,
            )
        ]
        summary[variant.label]["speedup_per_seed"] = per_seed
    name = args.name or f"async_{args.env.split('-')[0].lower()}"
    plot(runs, Path(args.out) / f"{name}.png")
    first = overlapped[0].label
    ratio = summary[first]["steps_per_s"] / summary["sync"]["steps_per_s"]
    returns = ", ".join(
        f"{v.label} {summary[v.label]['return_mean']:.0f} ± {summary[v.label]['return_std']:.0f}" for v in variants
    )
    per_seed = statistics.mean(summary[first]["speedup_per_seed"])
    line = (
        f"async: {first}/sync env steps/s: {ratio:.2f}x (mean of {per_seed:.2f}x per seed); return {returns}"
        f" at {args.steps} steps ({len(args.seeds)} seeds)"
    )
    save_result(
        name,
        {"args": {**vars(args), "evaluation_grid": grid}, "runs": runs, "summary": summary, "line": line},
        args.out,
    )
    print(line)


if __name__ == "__main__":
    main()
