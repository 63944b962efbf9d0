"""m2flow's own cost per micro task, against a hand-written single-process loop doing the same work.

The same simulator (m2flow.workers.env.GymEnv) and policy (m2flow.workers.rollout.TorchPolicy) run
(a) in one Python loop: obs = env.obs(); repeat: obs = env.step(policy.act(obs)), and
(b) through m2flow: one simulator worker and one inference worker (two Ray actors), the per-step
observations and actions crossing the workers' own channel, both pinned to one core (`shared`, S=1:
the same core budget as the hand-written loop),
(c) the same, with `placement.colocate: true`: both workers in one process, the per-step data a direct
call, and
(d) the two workers on two cores with the batch cut in two pipeline slices (`hybrid`, S=2).
Steps per second of all four, side by side.

    python benchmarks/engine_overhead.py [--iterations 6]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from results_io import save_result

import m2flow as mf
from m2flow.config import spec_from_dict

GYM = "m2flow.workers.env.GymEnv"
CAMERA = "m2flow.workers.env.CameraEnv"
VIEW = {"cameras": ["track"], "modalities": ["rgb", "proprio"], "size": [64, 64]}
CASES = [  # (label, simulator class, env args, policy args, envs, horizon): cheap physics to camera steps
    ("cheap (InvertedPendulum, 1 env)", GYM, {"env_id": "InvertedPendulum-v5"}, {}, 1, 512),
    ("MuJoCo (HalfCheetah, 8 envs)", GYM, {"env_id": "HalfCheetah-v5"}, {}, 8, 512),
    ("heavy (Humanoid, 8 envs)", GYM, {"env_id": "Humanoid-v5"}, {}, 8, 512),
    (
        "camera (HalfCheetah 64x64 RGB, CNN, 8 envs)",
        CAMERA,
        {"env_id": "HalfCheetah-v5", "observation": VIEW},
        {"model": "cnn", "hidden": [64], "observation": VIEW},
        8,
        128,
    ),
]


def hand_written(sim: str, env_args: dict, policy_args: dict, num_envs: int, horizon: int, iterations: int) -> float:
    from m2flow.context import WorkerContext, set_context
    from m2flow.resolve import resolve
    from m2flow.workers.rollout import TorchPolicy

    set_context(WorkerContext(items=(0, num_envs)))
    env = resolve(sim, "simulator")(**env_args, num_envs=num_envs)
    policy = TorchPolicy(env_id=env_args["env_id"], **policy_args)
    rates = []
    for _ in range(iterations):
        start = time.perf_counter()
        obs = env.obs()
        for _ in range(horizon):
            obs = env.step(policy.act(obs))
        rates.append(horizon * num_envs / (time.perf_counter() - start))
        env.trajectory()
    return statistics.median(rates[1:])


def through_m2flow(
    sim: str,
    env_args: dict,
    policy_args: dict,
    num_envs: int,
    horizon: int,
    iterations: int,
    out: Path,
    mode: str = "shared",
    stages: int = 1,
    colocate: bool = False,
) -> float:
    spec = spec_from_dict(
        {
            "name": "overhead",
            "workers": {
                "env": {"kind": "simulator", "class": sim, "args": {**env_args, "num_envs": num_envs}},
                "policy": {  # on a CPU core like the hand-written loop's policy, also where there are GPUs
                    "kind": "inference",
                    "class": "m2flow.workers.rollout.TorchPolicy",
                    "args": {"env_id": env_args["env_id"], **policy_args},
                    "resources": {"device": "cpu"},
                },
            },
            "flow": {"loop": {"horizon": horizon, "edges": ["env.obs -> policy.act", "policy.act -> env.step"]}},
            "placement": {"mode": mode, "pipeline_stages": stages, "colocate": colocate},
            "run": {
                "iterations": iterations,
                "output_dir": str(out),
                "progress": False,
                "checkpoint_every": 0,
                "trace_detail_iterations": 0,
            },
        }
    )
    result = mf.run(spec)
    loop_rates = [h["env_steps"] / h["time/loop_s"] for h in _per_iteration(result.history)]
    return statistics.median(loop_rates[1:])


def _per_iteration(history: list[dict]) -> list[dict]:
    """Steps of each iteration alone (the history holds running totals)."""
    rows, before = [], 0
    for h in history:
        rows.append({**h, "env_steps": h["env_steps"] - before})
        before = h["env_steps"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()

    import ray

    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for label, sim, env_args, policy_args, envs, horizon in CASES:
        case = (sim, env_args, policy_args, envs, horizon, args.iterations)
        hand = hand_written(*case)
        shared = through_m2flow(*case, out / "tmp")
        together = through_m2flow(*case, out / "tmp", colocate=True)
        row = {
            "case": label,
            "hand_steps_per_s": hand,
            "m2flow_steps_per_s": shared,
            "ratio": shared / hand,
            "m2flow_colocated_steps_per_s": together,
            "colocated_ratio": together / hand,
        }
        line = f"{label:44s} hand {hand:7.0f} steps/s   m2flow {shared:7.0f} ({shared / hand:.2f}x)"
        line += f"   colocated {together:7.0f} ({together / hand:.2f}x)"
        if envs > 1:
            piped = through_m2flow(*case, out / "tmp", "hybrid", 2)
            row.update(m2flow_hybrid_s2_steps_per_s=piped, hybrid_ratio=piped / hand)
            line += f"   hybrid S=2 {piped:7.0f} ({piped / hand:.2f}x)"
        rows.append(row)
        print(line, flush=True)
    save_result("engine_overhead", {"rows": rows}, out)
    worst = min(rows, key=lambda r: r["colocated_ratio"])
    mujoco = rows[1]
    print(
        f"m2flow/hand-written: {mujoco['colocated_ratio']:.2f}x colocated (MuJoCo, one core;"
        f" {mujoco['ratio']:.2f}x as two processes), {mujoco['hybrid_ratio']:.2f}x pipelined on two;"
        f" worst colocated {worst['colocated_ratio']:.2f}x ({worst['case']})"
    )


if __name__ == "__main__":
    main()
