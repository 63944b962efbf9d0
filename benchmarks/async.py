"""Synchronous PPO against one-step-off (and k-off) PPO on the same workload, seeds and env-step budget:
env steps/s end to end, and deterministic evaluation return against env steps and wall time.

Each variant is `configs/ppo_mujoco.yaml` run by `learning.py`'s m2flow runner (evaluations every
`--eval-every` env steps, left out of the wall time); `k` adds `flow.async.max_staleness=k`, and the planner
places the workers for the flow it is given.

    python benchmarks/async.py [--env HalfCheetah-v5] [--steps 100000] [--seeds 1 2 3] [--staleness 1 2]
        [--set KEY=VALUE ...]

Writes benchmarks/results/async_<env>.json and async_<env>.png. Last line:
`async: one-step-off/sync env steps/s: <x>x; return sync <mean> ± <std>, 1-off <mean> ± <std>, ... at <N> steps
(<k> seeds)`.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from learning import at, m2flow_run, plot, summarise
from results_io import RESULTS, save_result


def label(k: int | None) -> str:
    return "sync" if k is None else f"{k}-off"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--eval-every", type=int, default=10_000)
    parser.add_argument("--staleness", type=int, nargs="+", default=[1], help="the k-off variants to run")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides for every variant")
    parser.add_argument("--name", help="the result's name (default async_<env>)")
    parser.add_argument("--out", default=str(RESULTS), help="the folder for the JSON and the plot")
    args = parser.parse_args()
    variants: list[int | None] = [None, *args.staleness]
    runs = []
    with tempfile.TemporaryDirectory(prefix="m2flow-async-") as tmp:
        for seed in args.seeds:  # variants side by side per seed: drift in the machine hits them alike
            for k in variants:
                overrides = [*args.set, *([f"flow.async.max_staleness={k}"] if k is not None else [])]
                run = m2flow_run(args.env, args.steps, seed, args.eval_every, Path(tmp), overrides, label(k))
                runs.append(run)
                print(
                    f"{label(k)} seed {seed}: {at(run['curve'], args.steps):.0f} at {args.steps} steps,"
                    f" {run['steps_per_s']:.0f} env steps/s",
                    flush=True,
                )
    summary = summarise(runs, args.steps)
    for k in args.staleness:
        per_seed = [
            b["steps_per_s"] / a["steps_per_s"]
            for a, b in zip(
                [r for r in runs if r["implementation"] == "sync"],
                [r for r in runs if r["implementation"] == label(k)],
                strict=True,
            )
        ]
        summary[label(k)]["speedup_per_seed"] = per_seed
    name = args.name or f"async_{args.env.split('-')[0].lower()}"
    plot(runs, Path(args.out) / f"{name}.png")
    first = label(args.staleness[0])
    ratio = summary[first]["steps_per_s"] / summary["sync"]["steps_per_s"]
    returns = ", ".join(
        f"{label(k)} {summary[label(k)]['return_mean']:.0f} ± {summary[label(k)]['return_std']:.0f}" for k in variants
    )
    per_seed = statistics.mean(summary[first]["speedup_per_seed"])
    line = (
        f"async: {first}/sync env steps/s: {ratio:.2f}x (mean of {per_seed:.2f}x per seed); return {returns}"
        f" at {args.steps} steps ({len(args.seeds)} seeds)"
    )
    save_result(name, {"args": vars(args), "runs": runs, "summary": summary, "line": line}, args.out)
    print(line)


if __name__ == "__main__":
    main()
