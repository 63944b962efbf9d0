"""A training worker on one core and on all its node's cores (`resources.threads`), side by side on the 2-core
machine: the camera job (a CNN policy from 84x84 pixels) and the main job (an MLP policy on HalfCheetah) by
default; `metaworld`, the Meta-World camera job as planner_accuracy.py runs it (a CNN policy from pixels), and
`sac`, the SAC job updating from its second iteration on (128 updates of 256x256 MLPs an iteration).

Every workload plans shared S=1, a process per replica, with no re-plan: the placement is the same in every run,
only `workers.actor.resources.threads` changes. Rounds alternate the order (1 then 2 cores, then 2 then 1); each
run's figures are the medians of its iterations after the first, a workload's the medians over its rounds. Every
run starts from a cost cache of its own, empty.

    python benchmarks/threads.py [--workloads {camera,main,metaworld,sac} ...] [--rounds 3] [--iterations 6]
        [--name threads]

Writes benchmarks/results/<name>.json. Last line: `threads 2/1: <workload> <x>x, ... per iteration`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from results_io import RESULTS, save_result

import m2flow as mf

ROOT = Path(__file__).resolve().parent.parent
FIXED = ("cluster.gpus=0", "placement.mode=shared", "placement.pipeline_stages=1", "placement.colocate=false")
WORKLOADS = {
    "camera": (
        "ppo_camera.yaml",
        "workers.env.replicas=2",
        "workers.env.args.num_envs=8",
        "flow.loop.horizon=32",
        "workers.env.args.video.save=false",
    ),
    "main": ("ppo_mujoco.yaml",),
    "metaworld": (
        "ppo_metaworld_camera.yaml",
        "workers.env.replicas=2",
        "flow.loop.horizon=16",
        "workers.env.args.video.save=false",
    ),
    "sac": ("sac_mujoco.yaml", "workers.buffer.args.learning_starts=256"),
}
CORES = (1, 2)


def measure(workload: str, threads: int, iterations: int, out: Path) -> dict:
    config, *overrides = WORKLOADS[workload]
    settings = [
        *overrides,
        *FIXED,
        f"workers.actor.resources.threads={threads}",
        f"run.iterations={iterations}",
        "placement.replan=false",
        "run.checkpoint_every=0",
        "run.progress=false",
        f"run.output_dir={out}",
    ]
    result = mf.run(mf.load_spec(ROOT / "configs" / config, settings))
    ran = result.history[1:]
    return {
        "iteration_s": statistics.median(h["time/iteration_s"] for h in ran),
        "then_s": statistics.median(h["time/then_s"] for h in ran),
        "loop_s": statistics.median(h["time/loop_s"] for h in ran),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", nargs="+", default=["camera", "main"], choices=list(WORKLOADS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--name", default="threads", help="the results file's name")
    args = parser.parse_args()
    runs, summary = [], {}
    with tempfile.TemporaryDirectory(prefix="m2flow-threads-") as tmp:
        for workload in args.workloads:
            for round_ in range(args.rounds):
                for threads in CORES if round_ % 2 == 0 else CORES[::-1]:
                    os.environ["M2FLOW_COST_CACHE"] = str(Path(tmp) / f"costs-{workload}-{round_}-{threads}")
                    run = {"workload": workload, "round": round_, "threads": threads}
                    run |= measure(workload, threads, args.iterations, Path(tmp) / "runs")
                    runs.append(run)
                    print(
                        f"{workload:7s} round {round_} threads {threads}: iteration {run['iteration_s']:.3f} s,"
                        f" training {run['then_s']:.3f} s, loop {run['loop_s']:.3f} s",
                        flush=True,
                    )
            mine = [r for r in runs if r["workload"] == workload]
            median = {
                (threads, key): statistics.median(r[key] for r in mine if r["threads"] == threads)
                for threads in CORES
                for key in ("iteration_s", "then_s")
            }
            summary[workload] = {
                "iteration_ratio": median[(1, "iteration_s")] / median[(2, "iteration_s")],
                "training_ratio": median[(1, "then_s")] / median[(2, "then_s")],
            }
            print(
                f"{workload}: 1 core {median[(1, 'iteration_s')]:.3f} s an iteration, 2 cores"
                f" {median[(2, 'iteration_s')]:.3f} s ({summary[workload]['iteration_ratio']:.2f}x);"
                f" training {summary[workload]['training_ratio']:.2f}x",
                flush=True,
            )
    line = "threads 2/1: " + ", ".join(f"{w} {s['iteration_ratio']:.2f}x" for w, s in summary.items())
    save_result(
        args.name, {"args": vars(args), "runs": runs, "summary": summary, "line": line + " per iteration"}, args.out
    )
    print(line + " per iteration")


if __name__ == "__main__":
    main()
