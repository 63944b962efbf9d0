"""Time to return: m2flow's PPO (or SAC) against Stable-Baselines3's with rl-zoo3's tuned settings, on the same
machine, env, env-step budget and seeds, evaluated the same way (10 deterministic episodes on fresh seeds
every `--eval-every` env steps, observations normalised with the training statistics of that moment).

The peers are installed from PyPI into a virtualenv of their own (`--peers-venv`, created on first use:
CPU torch 2.13.0 from this machine's wheel, stable-baselines3 and rl-zoo3 2.9.2 pinned); their tuned
settings are read from rl-zoo3's own hyperparams/ppo.yml (sac.yml with `--algo sac`, m2flow running
configs/sac_mujoco.yaml instead of configs/ppo_mujoco.yaml). CleanRL 1.2.0 is not run: its scripts target
gymnasium 0.29's API (NEXT_STEP autoreset, `final_observation` infos), not gymnasium 1.x.

    python benchmarks/learning.py [--algo ppo|sac] [--env HalfCheetah-v5] [--steps 100000] [--seeds 1 2 3]
        [--eval-every 10000] [--skip-peers] [--set workers.actor.args.minibatch_size=128 ...]

Writes benchmarks/results/learning_<env>.json (learning_sac_<env>.json for SAC) and its .png (evaluation return
against env steps and against wall time). Last line: `learning: m2flow <mean> ± <std> vs sb3-zoo <mean> ± <std>;
time to 1500 (s): m2flow [...], sb3-zoo [...] (None: not reached) at <N> steps (<k> seeds)`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

from results_io import RESULTS, save_result

import m2flow as mf

ROOT = Path(__file__).resolve().parent.parent
PEERS = ["stable-baselines3==2.9.2", "rl-zoo3==2.9.2"]


@dataclass(frozen=True)
class Algo:
    config: str  # m2flow's preset in configs/
    steps_per_iteration: int  # its envs x horizon
    sb3: str  # the Stable-Baselines3 class, whose RL Zoo settings are hyperparams/<name>.yml


ALGOS = {"ppo": Algo("ppo_mujoco.yaml", 8 * 64, "PPO"), "sac": Algo("sac_mujoco.yaml", 4 * 32, "SAC")}


def m2flow_run(
    env_id: str,
    steps: int,
    seed: int,
    eval_every: int,
    out: Path,
    overrides: list[str],
    label: str = "m2flow",
    algo: Algo = ALGOS["ppo"],
) -> dict:
    iterations = steps // algo.steps_per_iteration
    every = max(1, eval_every // algo.steps_per_iteration)
    policy = ["env.args.evaluation.policy", "rollout.args", "actor.args"]
    spec = mf.load_spec(
        ROOT / "configs" / algo.config,
        [
            f"run.iterations={iterations + 1}",  # the last sync runs an evaluation at `steps`
            f"run.seed={seed}",
            f"run.output_dir={out}",
            "run.progress=false",
            "run.checkpoint_every=0",
            f"flow.sync.1.every={every}",
            "workers.env.args.evaluation.episodes=10",
            f"workers.env.args.env_id={env_id}",
            *[f"workers.{key}.env_id={env_id}" for key in policy],
            *overrides,
        ],
    )
    result = mf.run(spec)
    curve, wall, collected = [], 0.0, 0
    for h in result.history:
        if "eval/return" in h:  # evaluated in the iteration's syncs, before its loops: the steps collected before
            curve.append({"steps": collected, "wall_s": wall, "return": h["eval/return"]})
            wall -= h["time/sync_s"]  # the evaluation runs in the iteration's syncs: not training time
        wall += h["time/iteration_s"]
        collected = h["env_steps"]
    run = {"implementation": label, "seed": seed, "curve": curve, "wall_s": wall, "steps_per_s": collected / wall}
    dropped = sum(h.get("async/dropped_steps", 0.0) for h in result.history)  # flow.async's drop mode
    return {**run, "busy": device_busy(result.run_dir), "trained_share": 1.0 - dropped / collected}


def device_busy(run_dir: Path) -> dict[str, float]:
    """Per device, the share of the run's iterations its tasks kept it busy (the run's trace: port calls, and
    the loop's busy time per replica), summed over the replicas on it."""
    events = json.loads((run_dir / "trace.json").read_text())["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X"]
    wall = sum(e["dur"] for e in spans if e["cat"] == "iteration")
    busy: dict[str, float] = {}
    for e in spans:
        if e["args"]["device"] != "controller":
            busy[e["args"]["device"]] = busy.get(e["args"]["device"], 0.0) + e["dur"] / wall
    return dict(sorted(busy.items()))


SB3_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    import numpy as np, yaml, rl_zoo3, gymnasium as gym
    import stable_baselines3
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize, sync_envs_normalization
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.callbacks import BaseCallback
    import torch.nn as nn

    env_id, steps, seed, every, out, algo = sys.argv[1], *map(int, sys.argv[2:5]), sys.argv[5], sys.argv[6]
    zoo = yaml.safe_load((Path(rl_zoo3.__file__).parent / "hyperparams" / f"{algo.lower()}.yml").read_text())
    key = env_id.replace("-v5", "-v4")
    hp = dict(zoo[key])
    normalize = bool(hp.get("normalize", False))
    for k in ("n_timesteps", "policy", "normalize", "n_envs", "normalize_kwargs"):
        hp.pop(k, None)
    if isinstance(hp.get("policy_kwargs"), str):
        hp["policy_kwargs"] = eval(hp["policy_kwargs"], {"nn": nn, "dict": dict})
    env = make_vec_env(env_id, n_envs=zoo[key].get("n_envs", 1), seed=seed)
    evaluation = make_vec_env(env_id, n_envs=1, seed=seed + 10_000)
    if normalize:
        env = VecNormalize(env, gamma=hp.get("gamma", 0.99))
        evaluation = VecNormalize(evaluation, training=False, norm_reward=False)

    class Evaluate(BaseCallback):
        def __init__(self):
            super().__init__()
            self.curve, self.start, self.next = [], time.time(), 0
        def _on_step(self):
            if self.num_timesteps >= self.next:
                wall = time.time() - self.start
                if normalize:
                    sync_envs_normalization(self.training_env, evaluation)
                mean, _ = evaluate_policy(self.model, evaluation, n_eval_episodes=10, deterministic=True)
                self.curve.append({"steps": self.num_timesteps, "wall_s": wall, "return": float(mean)})
                self.start += time.time() - self.start - wall  # evaluation time is not training time
                self.next += every
            return True

    callback = Evaluate()
    model = getattr(stable_baselines3, algo)("MlpPolicy", env, seed=seed, verbose=0, **hp)
    model.learn(steps + 1, callback=callback)
    wall = time.time() - callback.start  # evaluations left out
    hyperparameters = {k: str(v) for k, v in hp.items()}
    Path(out).write_text(json.dumps({"curve": callback.curve, "wall_s": wall, "hyperparameters": hyperparameters}))
    """
)


def peers_python(venv: Path) -> Path:
    """The peers' own virtualenv, installed on first use."""
    python = venv / "bin" / "python"
    if not (venv / ".installed").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, "torch==2.13.0"], check=True)
        constraints = ROOT / "requirements" / "constraints.txt"
        subprocess.run([*pip, "-c", str(constraints), *PEERS, "gymnasium[mujoco]==1.4.0", "mujoco==3.3.0"], check=True)
        (venv / ".installed").touch()
    return python


def sb3_run(python: Path, env_id: str, steps: int, seed: int, eval_every: int, out: Path, algo: Algo) -> dict:
    script, result = out / "sb3_zoo.py", out / f"sb3_{seed}.json"
    script.write_text(SB3_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MUJOCO_GL": "egl"}
    arguments = [env_id, str(steps), str(seed), str(eval_every), str(result), algo.sb3]
    subprocess.run([str(python), str(script), *arguments], check=True, env=env)
    data = json.loads(result.read_text())
    return {
        "implementation": "sb3-zoo",
        "seed": seed,
        "curve": data["curve"],
        "wall_s": data["wall_s"],
        "steps_per_s": steps / data["wall_s"],
        "hyperparameters": data["hyperparameters"],
    }


def at(curve: list[dict], steps: int) -> float:
    """The evaluation return at `steps` (the last evaluation at or before it)."""
    return max((p for p in curve if p["steps"] <= steps), key=lambda p: p["steps"])["return"]


def time_to(curve: list[dict], target: float) -> float | None:
    return next((p["wall_s"] for p in curve if p["return"] >= target), None)


def summarise(runs: list[dict], steps: int) -> dict:
    by = {}
    for name in sorted({r["implementation"] for r in runs}):
        mine = [r for r in runs if r["implementation"] == name]
        returns = [at(r["curve"], steps) for r in mine]
        by[name] = {
            "return_mean": statistics.mean(returns),
            "return_std": statistics.pstdev(returns),
            "returns": returns,
            "time_to_1000_s": [time_to(r["curve"], 1000) for r in mine],
            "time_to_1500_s": [time_to(r["curve"], 1500) for r in mine],
            "steps_per_s": statistics.mean(r["steps_per_s"] for r in mine),
        }
    return by


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    palette = iter(["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"])
    colours = {name: next(palette) for name in dict.fromkeys(r["implementation"] for r in runs)}
    for run in runs:
        c = colours[run["implementation"]]
        label = f"{run['implementation']} seed {run['seed']}"
        axes[0].plot([p["steps"] for p in run["curve"]], [p["return"] for p in run["curve"]], color=c, label=label)
        axes[1].plot([p["wall_s"] for p in run["curve"]], [p["return"] for p in run["curve"]], color=c, label=label)
    axes[0].set_xlabel("env steps")
    axes[1].set_xlabel("wall seconds (training)")
    for ax in axes:
        ax.set_ylabel("deterministic evaluation return")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--algo", choices=sorted(ALGOS), default="ppo")
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--eval-every", type=int, default=10_000)
    parser.add_argument("--peers-venv", default=str(Path(tempfile.gettempdir()) / "m2flow-peers"))
    parser.add_argument("--skip-peers", action="store_true")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides of m2flow's config")
    parser.add_argument("--name", help="the result's name (default learning_<env>)")
    args = parser.parse_args()
    algo = ALGOS[args.algo]
    runs = []
    with tempfile.TemporaryDirectory(prefix="m2flow-learning-") as tmp:
        for seed in args.seeds:
            runs.append(m2flow_run(args.env, args.steps, seed, args.eval_every, Path(tmp), args.set, algo=algo))
            print(f"m2flow seed {seed}: {at(runs[-1]['curve'], args.steps):.0f} at {args.steps} steps", flush=True)
        if not args.skip_peers:
            python = peers_python(Path(args.peers_venv))
            for seed in args.seeds:
                runs.append(sb3_run(python, args.env, args.steps, seed, args.eval_every, Path(tmp), algo))
                print(f"sb3-zoo seed {seed}: {at(runs[-1]['curve'], args.steps):.0f} at {args.steps} steps", flush=True)
    summary = summarise(runs, args.steps)
    algo_part = "" if args.algo == "ppo" else f"{args.algo}_"
    name = args.name or f"learning_{algo_part}{args.env.split('-')[0].lower()}"
    plot(runs, RESULTS / f"{name}.png")
    mine, peer = summary["m2flow"], summary.get("sb3-zoo")
    line = f"learning: m2flow {mine['return_mean']:.0f} ± {mine['return_std']:.0f} ({mine['steps_per_s']:.0f} steps/s)"
    if peer is not None:
        line += f" vs sb3-zoo {peer['return_mean']:.0f} ± {peer['return_std']:.0f} ({peer['steps_per_s']:.0f} steps/s)"
        ours, theirs = mine["time_to_1500_s"], peer["time_to_1500_s"]
        if None not in ours and None not in theirs:
            line += f"; time to 1500: {statistics.mean(theirs) / statistics.mean(ours):.1f}x faster"
        else:
            line += f"; time to 1500 (s): m2flow {ours}, sb3-zoo {theirs} (None: not reached)"
    line += f" at {args.steps} steps ({len(args.seeds)} seeds)"
    save_result(name, {"args": vars(args), "runs": runs, "summary": summary, "line": line})
    print(line)


if __name__ == "__main__":
    main()
