"""Fault injection at random: N runs of a small PPO job, each with a random worker process killed at a
random moment. Prints runs completed, detections, detection latency, recoveries and checkpoints lost.

    python benchmarks/faults.py [--runs 6] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from results_io import save_result

import m2flow as mf
from m2flow.config import spec_from_dict
from m2flow.runtime.checkpoint import load_checkpoint
from m2flow.runtime.launch import replica_process

ITERATIONS = 8
VICTIMS = ["env:0", "env:1", "rollout:0", "actor:0", "actor:1"]


def job(out: Path, name: str) -> mf.WorkflowSpec:
    return spec_from_dict(job_dict(out, name))


def job_dict(out: Path, name: str, horizon: int = 128) -> dict:
    """A small PPO job (InvertedPendulum, 2 simulator replicas x 4 envs, a policy, 2 training ranks), each
    replica a process of its own, a checkpoint every iteration, restarted on a failure."""
    env = {"env_id": "InvertedPendulum-v5"}
    args = {**env, "hidden": [32, 32]}
    return {
        "name": name,
        "workers": {
            "env": {
                "kind": "simulator",
                "class": "m2flow.workers.env.GymEnv",
                "replicas": 2,
                "args": {**env, "num_envs": 4},
            },
            "rollout": {"kind": "inference", "class": "m2flow.workers.rollout.TorchPolicy", "args": args},
            "actor": {
                "kind": "training",
                "class": "m2flow.workers.actor.PPO",
                "replicas": 2,
                "args": {**args, "num_minibatches": 4, "update_epochs": 4},
            },
        },
        "flow": {
            "loop": {"horizon": horizon, "edges": ["env.obs -> rollout.act", "rollout.act -> env.step"]},
            "then": ["env.trajectory -> actor.train"],
            "sync": [{"edge": "actor.weights -> rollout.load_weights"}],
        },
        "placement": {"mode": "shared", "colocate": False},  # each victim a process of its own
        "run": {
            "iterations": ITERATIONS,
            "output_dir": str(out),
            "progress": False,
            "checkpoint_every": 1,
            "on_failure": "restart",
            "timeouts": {"floor_s": 15},
        },
    }


def checkpoints_lost(run_dir: Path, iterations: Iterable[int]) -> int:
    """How many of the checkpoints of these iterations under `run_dir` do not load."""
    lost = 0
    for it in iterations:
        try:
            load_checkpoint(run_dir / "checkpoints" / f"iter_{it:08d}")
        except (OSError, RuntimeError):
            lost += 1
    return lost


def one_run(out: Path, index: int, rng: random.Random) -> dict:
    import ray

    name = f"faults-{index}"
    victim, delay = rng.choice(VICTIMS), rng.uniform(0.0, 1.5)
    record: dict = {"victim": victim}

    def kill():
        metrics = out / name / "metrics.jsonl"
        while not (metrics.exists() and metrics.read_text().count("\n") >= 2):
            time.sleep(0.02)
        time.sleep(delay)
        actor = replica_process(name, victim)
        record["killed_at"] = time.time()  # before the kill: the run may notice it before ray.kill returns
        ray.kill(actor, no_restart=True)

    threading.Thread(target=kill, daemon=True).start()
    try:
        result = mf.run(job(out, name))
    except mf.M2FlowError as exc:
        return {**record, "completed": False, "error": str(exc).splitlines()[0]}
    lost = checkpoints_lost(result.run_dir, range(ITERATIONS))
    detections = [f["detected_at"] - record["killed_at"] for f in result.failures if "killed_at" in record]
    return {
        **record,
        "completed": result.iterations == ITERATIONS,
        "failures": len(result.failures),
        "detection_s": detections[0] if detections else None,
        "checkpoints_lost": lost,
        "iterations": [h["iteration"] for h in result.history] == list(range(ITERATIONS)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()

    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    out = Path(args.out)
    rng = random.Random(args.seed)
    rows = []
    for index in range(args.runs):
        row = one_run(out / "tmp", index, rng)
        rows.append(row)
        print(json.dumps(row), flush=True)
    latencies = [r["detection_s"] for r in rows if r.get("detection_s") is not None]
    completed = sum(r["completed"] for r in rows)
    detected = sum(1 for r in rows if r.get("failures"))
    recovered = sum(1 for r in rows if r.get("failures") and r["completed"] and r.get("iterations"))
    lost = sum(r.get("checkpoints_lost", 0) for r in rows)
    median = statistics.median(latencies) if latencies else float("nan")
    save_result("faults", {"rows": rows}, out)
    print(
        f"runs completed: {completed}/{len(rows)}, detections: {detected}, median detection latency:"
        f" {median:.2f} s, recoveries: {recovered}, checkpoints lost: {lost}"
    )
    sys.exit(0 if lost == 0 else 1)


if __name__ == "__main__":
    main()
