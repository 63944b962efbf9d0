"""The planner: (a) how long planning takes as clusters and graphs grow, (b) how well it predicts.

(a) plans a 3-worker (env, rollout, actor) and a 5-worker (+ reward model, + critic) workflow on
    8 .. 1,024 GPUs (8 per node), `auto` over every mode and stage count; no Ray, no torch. The replica counts
    are given (a quarter of the GPUs each for the simulators, inference and training), and then, for the
    5-worker one, chosen by the planner (`replicas: auto` for inference and training: the allocation search).
(b) plans configs/ppo_camera.yaml on 8 GPUs and 64 CPUs with `replicas: auto`, beside RLinf-style hand layouts
    of the same job (`placement.devices`, replica counts written by hand), all on the costs a dry run has.
(c) runs synthetic spin workers with known costs for real in each mode on this machine (modes.py's
    workflow) and prints predicted vs measured iteration time and whether `auto` picked the fastest.

    python benchmarks/planner.py [--skip-accuracy]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from results_io import save_result

from m2flow.cluster import Cluster
from m2flow.config import load_spec, spec_from_dict
from m2flow.graph import build_graph
from m2flow.planners import make_plan

SIZES = [8, 64, 256, 1024]
REPEATS = 5  # each plan timed 5 times, the median reported (one machine's runs vary by up to a fifth)
ROOT = Path(__file__).resolve().parents[1]
CAMERA_JOB = (
    ROOT / "configs" / "ppo_camera.yaml",
    ("cluster.gpus=8", "cluster.cpus=64", "workers.env.args.video.save=false"),
)
ALLOCATED = (
    "workers.env.replicas=auto",
    "workers.env.args.num_envs=64",  # with `auto`, the total the planner splits into processes
    "workers.rollout.replicas=auto",
    "workers.actor.replicas=auto",
)


@dataclass(frozen=True)
class HandLayout:
    """A placement of the camera job as an RLinf user writes one: replica counts and device ranges by hand."""

    name: str
    rollout: tuple[int, str]  # replicas, GPUs
    actor: tuple[int, str]
    env_replicas: int = 16  # simulator processes (64 envs in all), left to span the CPU cores

    def overrides(self) -> list[str]:
        return [
            f"workers.env.replicas={self.env_replicas}",
            f"workers.env.args.num_envs={64 // self.env_replicas}",
            f"workers.rollout.replicas={self.rollout[0]}",
            f"placement.devices.rollout={self.rollout[1]}",
            f"workers.actor.replicas={self.actor[0]}",
            f"placement.devices.actor={self.actor[1]}",
        ]


HAND_LAYOUTS = [
    HandLayout("collocated: rollout and actor on all 8 GPUs", (8, "all"), (8, "all")),
    HandLayout("collocated, 64 simulator processes", (8, "all"), (8, "all"), env_replicas=64),
    HandLayout("disaggregated: rollout 0-3, actor 4-7", (4, "0-3"), (4, "4-7")),
    HandLayout("disaggregated: rollout 0-1, actor 2-7", (2, "0-1"), (6, "2-7")),
    HandLayout("disaggregated: rollout 0-5, actor 6-7", (6, "0-5"), (2, "6-7")),
]


def big_workflow(gpus: int, workers: int, allocate: bool = False) -> dict:
    share = max(1, gpus // 4)  # a training rank per simulator replica: each takes one shard of trajectories
    sim = "m2flow.workers.synthetic.SpinSimulator"
    spec = {
        "name": f"scale-{workers}w-{gpus}",
        "workers": {
            "env": {
                "kind": "simulator",
                "class": sim,
                "replicas": share,
                "args": {"num_envs": 16},
                "resources": {"device": "gpu", "memory_gb": 10},
                "profile": {"step": {"per_item_s": 2e-3}},
            },
            "rollout": {
                "kind": "inference",
                "class": "m2flow.workers.synthetic.SpinPolicy",
                "replicas": share,
                "resources": {"memory_gb": 30},
                "profile": {"act": {"fixed_s": 5e-3, "per_item_s": 5e-4}},
            },
            "actor": {
                "kind": "training",
                "class": "m2flow.workers.synthetic.SpinTrainer",
                "replicas": share,
                "resources": {"memory_gb": 40},
                "profile": {"train": {"per_item_s": 1e-4}},
            },
        },
        "flow": {
            "loop": {"horizon": 256, "edges": ["env.obs -> rollout.act", "rollout.act -> env.step"]},
            "then": ["env.trajectory -> actor.train"],
            "sync": [{"edge": "actor.weights -> rollout.load_weights"}],
        },
        "placement": {"mode": "auto", "pipeline_stages": "auto"},
        "cluster": {"gpus": gpus, "cpus": gpus, "nodes": max(1, gpus // 8)},
    }
    if workers == 5:
        spec["workers"]["reward"] = {
            "kind": "inference",
            "class": "m2flow.workers.synthetic.SpinTrainer",
            "replicas": share,
            "resources": {"memory_gb": 5},
        }
        spec["workers"]["critic"] = {
            "kind": "training",
            "class": "m2flow.workers.synthetic.SpinTrainer",
            "replicas": share,
            "resources": {"memory_gb": 20},
        }
        spec["flow"]["then"] += ["env.trajectory -> reward.train", "reward.weights -> critic.train"]
    if allocate:
        for worker in ("rollout", "actor"):
            spec["workers"][worker]["replicas"] = "auto"
    return spec


def plan_times(out: Path) -> list[dict]:
    rows = []
    print(f"{'workers':>7s} {'GPUs':>6s} {'nodes':>6s} {'plan s':>8s} {'chosen':>22s} {'candidates':>10s}")
    for workers, allocate in ((3, False), (5, False), (5, True)):
        for gpus in SIZES:
            spec = spec_from_dict(big_workflow(gpus, workers, allocate))
            graph = build_graph(spec)
            runs = []
            for _ in range(REPEATS):
                start = time.perf_counter()
                plan = make_plan(graph, Cluster.from_spec(spec.cluster))
                runs.append(time.perf_counter() - start)
            seconds = statistics.median(runs)
            chosen = f"{plan.mode} S={plan.pipeline_stages}"
            rows.append(
                {
                    "workers": workers,
                    "allocation": allocate,
                    "gpus": gpus,
                    "nodes": spec.cluster.nodes,
                    "plan_s": seconds,
                    "plan_s_runs": runs,
                    "chosen": chosen,
                    "candidates": len(plan.candidates),
                    "tasks": len(plan.tasks),
                }
            )
            print(
                f"{workers:7d} {gpus:6d} {spec.cluster.nodes:6d} {seconds:8.2f} {chosen:>22s}"
                f" {len(plan.candidates):10d}{'  (allocation)' if allocate else ''}",
                flush=True,
            )
    return rows


def plan_camera_job(*overrides: str):
    config, cluster = CAMERA_JOB
    spec = load_spec(config, [*cluster, *overrides])
    graph = build_graph(spec)
    return make_plan(graph, Cluster.from_spec(spec.cluster))


def against_hand_layouts() -> list[dict]:
    """Auto with the replica counts its own (first row) beside each hand layout, predicted on the same costs."""
    rows = []
    print(f"\n{'layout':44s} {'plan':>26s} {'s/iteration':>12s} {'env steps/s':>12s}")
    for name, overrides in [("auto, replicas: auto", ALLOCATED), *((h.name, h.overrides()) for h in HAND_LAYOUTS)]:
        plan = plan_camera_job(*overrides)
        prediction = plan.predicted
        rows.append(
            {
                "layout": name,
                "plan": f"{plan.mode} S={plan.pipeline_stages}",
                "iteration_s": prediction.iteration_s,
                "env_steps_per_s": prediction.env_steps_per_s,
                "allocation": next((n for n in plan.notes if n.startswith("allocation:")), ""),
                "idle": [n for n in plan.notes if n.startswith("left idle:")],
            }
        )
        print(f"{name:44s} {rows[-1]['plan']:>26s} {prediction.iteration_s:12.4f} {prediction.env_steps_per_s:12,.0f}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-accuracy", action="store_true")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = plan_times(out)
    save_result("planner_scale", {"rows": rows}, out)
    five = [r for r in rows if r["workers"] == 5]
    largest = {
        allocate: max((r for r in five if r["allocation"] is allocate), key=lambda r: r["gpus"])
        for allocate in (False, True)
    }
    layouts = against_hand_layouts()
    best_hand = min(layouts[1:], key=lambda r: r["iteration_s"])
    save_result("planner_hand_layouts", {"config": "configs/ppo_camera.yaml", "rows": layouts}, out)
    summary = (
        f"plan time, 5 workers on {largest[True]['gpus']} GPUs in {largest[True]['nodes']} nodes:"
        f" {largest[False]['plan_s']:.2f} s, {largest[True]['plan_s']:.2f} s choosing replica counts;"
        f" camera job on 8 GPUs, best hand layout / auto: {best_hand['iteration_s'] / layouts[0]['iteration_s']:.2f}x"
    )
    if not args.skip_accuracy:
        import subprocess
        import sys

        print("\nprediction accuracy (benchmarks/modes.py):", flush=True)
        subprocess.run([sys.executable, str(Path(__file__).with_name("modes.py")), "--out", str(out)], check=True)
    print(summary)  # last, after modes.py's own lines


if __name__ == "__main__":
    main()
