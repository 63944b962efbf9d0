"""Time to return: m2flow's PPO (or SAC) against Stable-Baselines3's, on the same machine, env, env-step budget
and seeds, evaluated the same way (10 deterministic episodes on fresh seeds every `--eval-every` env steps,
rounded down to a multiple of m2flow's iteration, the same grid for every implementation (`evaluation_grid`);
observations normalised with the training statistics of that moment).

The peers (`--peers`):
- `sb3-zoo`: SB3 with rl-zoo3's tuned settings, read from rl-zoo3's own hyperparams/ppo.yml (sac.yml with
  `--algo sac`, m2flow running configs/sac_mujoco.yaml instead of configs/ppo_mujoco.yaml);
- `sb3-cleanrl` (PPO only): SB3's PPO set to CleanRL 1.2.0 ppo_continuous_action.py's defaults (one env, 2048
  steps, 32 minibatches, 10 epochs, lr 3e-4 annealed to 0 over the run, gamma 0.99, GAE 0.95, clip 0.2, no
  entropy bonus, gradient norm 0.5, tanh 64x64 orthogonally initialised, log-std 0, Adam eps 1e-5,
  observations and rewards normalised and clipped at 10). Where it differs from CleanRL: the value loss is the
  plain MSE weighted 0.25 (CleanRL: half the MSE weighted 0.5, the same gradient) and it is not clipped
  (CleanRL takes the larger of the clipped and the unclipped loss, which SB3's `clip_range_vf` does not); an
  episode a time limit cuts is bootstrapped from its last observation's value, as m2flow does (CleanRL 1.2.0
  ends the return there); the learning rate of an update is the one for the steps collected before it (one
  update behind CleanRL's schedule). CleanRL 1.2.0 itself is not run: its scripts target gymnasium
  0.29's API (NEXT_STEP autoreset, `final_observation` infos), not gymnasium 1.x.
On a camera workflow (`--config ppo_mujoco_camera.yaml`: m2flow's simulator renders an `observation`) the peers
see what m2flow's policy sees, the same camera's RGB image at the same size beside the env's state, through SB3's
`MultiInputPolicy` (`sb3_peer.py`). rl-zoo3 has no settings for HalfCheetah from pixels: there `sb3-zoo` is its
state-based HalfCheetah entry on these inputs.
They are installed from PyPI into a virtualenv of their own (`--peers-venv`, created on first use: CPU torch
2.13.0 from this machine's wheel, stable-baselines3 and rl-zoo3 2.9.2 pinned), or run by an interpreter that
already has them (`--peers-python`; `sb3-cleanrl` needs no rl-zoo3).

    python benchmarks/learning.py [--algo ppo|sac] [--env HalfCheetah-v5] [--steps 100000] [--seeds 1 2 3]
        [--eval-every 10000] [--peers sb3-zoo sb3-cleanrl | --skip-peers] [--skip-m2flow]
        [--config ppo_hopper.yaml] [--set workers.actor.args.minibatch_size=128 ...]
    python benchmarks/learning.py --merge [LABEL=]PART.json ... --name NAME [--at STEPS]  # parts run apart

Writes benchmarks/results/learning_<env>.json (learning_sac_<env>.json for SAC) and its .png (evaluation return
against env steps and against wall time). Last line: `learning: m2flow <mean> ± <std> (<x> steps/s) vs <peer>
<mean> ± <std> (<y> steps/s); time to 1500: <r>x faster at <N> steps (<k> seeds)` (per peer; the times to 1500
listed instead where a seed did not reach it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from results_io import RESULTS, save_result

ROOT = Path(__file__).resolve().parent.parent
PEER_REQUIREMENTS = ["stable-baselines3==2.9.2", "rl-zoo3==2.9.2"]


@dataclass(frozen=True)
class Algo:
    config: str  # m2flow's preset in configs/
    sb3: str  # the Stable-Baselines3 class, whose RL Zoo settings are hyperparams/<name>.yml


ALGOS = {"ppo": Algo("ppo_mujoco.yaml", "PPO"), "sac": Algo("sac_mujoco.yaml", "SAC")}


@dataclass(frozen=True)
class Peer:
    settings: str  # what sb3_peer.py sets the algorithm to: rl-zoo3's tuned file, or CleanRL's defaults
    algos: tuple[str, ...]  # the algorithms it has settings for


PEER_KINDS = {"sb3-zoo": Peer("zoo", ("ppo", "sac")), "sb3-cleanrl": Peer("cleanrl", ("ppo",))}


def m2flow_spec(
    env_id: str, seed: int, out: Path, overrides: list[str], algo: Algo, config: str | None
) -> tuple[Path, list[str]]:
    """The workflow file of `config` (in configs/; default the algorithm's preset) and the settings that run
    it on `env_id` with this seed, output folder and evaluation."""
    policy = ["env.args.evaluation.policy", "rollout.args", "actor.args"]
    path, task = ROOT / "configs" / (config or algo.config), [f"workers.{key}.env_id={env_id}" for key in policy]
    settings = [f"run.seed={seed}", f"run.output_dir={out}", "run.progress=false", "run.checkpoint_every=0"]
    settings += ["workers.env.args.evaluation.episodes=10", f"workers.env.args.env_id={env_id}", *task]
    return path, [*settings, *overrides]


def per_iteration(path: Path, settings: list[str]) -> int:
    """The env steps an iteration of the workflow collects."""
    import m2flow as mf

    drafted = mf.load_spec(path, settings)
    env = drafted.workers["env"]
    return env.replicas * env.args.get("num_envs", 1) * drafted.flow.loop.horizon


PEER_MODALITIES = {"rgb", "proprio"}  # what the peers' pixel wrapper renders (sb3_peer.Pixels)


def camera_view(path: Path, settings: list[str]) -> dict | None:
    """The camera `observation` m2flow's simulator renders for its policy (None: the state alone), which the
    peers are given too."""
    import m2flow as mf
    from m2flow.workers.env.observation import CameraObservation

    args = mf.load_spec(path, settings).workers["env"].args
    if args.get("observation") is None:
        return None
    view = CameraObservation(**args["observation"])
    if len(view.cameras) != 1 or not set(view.modalities) <= PEER_MODALITIES:
        raise SystemExit(
            f"learning.py: the peers render one camera's {sorted(PEER_MODALITIES)}; the workflow's simulator"
            f" reads {view.cameras} x {view.modalities}"
        )
    return view.model_dump(mode="json")


def evaluation_grid(env_id: str, eval_every: int, overrides: list[str], algo: Algo, config: str | None) -> int:
    """The env steps between evaluations, for m2flow and its peers alike: the largest multiple of m2flow's
    iteration at or below `eval_every`, one iteration at least (m2flow evaluates between iterations), so that
    the implementations of one run are evaluated at the same env step counts and the last evaluation within
    the budget comes at the same one. Parts run apart share it where they are given the same workflow."""
    size = per_iteration(*m2flow_spec(env_id, 0, Path("."), overrides, algo, config))
    return max(1, eval_every // size) * size


def m2flow_run(
    env_id: str,
    steps: int,
    seed: int,
    grid: int,
    out: Path,
    overrides: list[str],
    label: str = "m2flow",
    algo: Algo = ALGOS["ppo"],
    config: str | None = None,
) -> dict:
    """One m2flow run of `config` (in configs/; default the algorithm's preset) on `env_id`, evaluated every
    `grid` env steps (a multiple of its iteration) from the first iteration."""
    import m2flow as mf

    path, settings = m2flow_spec(env_id, seed, out, overrides, algo, config)
    size = per_iteration(path, settings)
    iterations, every = steps // size, max(1, grid // size)
    spec = mf.load_spec(path, [*settings, f"run.iterations={iterations + 1}", f"flow.sync.1.every={every}"])
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
    return {**run, "busy": result.device_busy, "trained_share": 1.0 - dropped / collected}


def peers_python(venv: Path) -> Path:
    """The peers' own virtualenv, installed on first use."""
    python = venv / "bin" / "python"
    if not (venv / ".installed").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, "torch==2.13.0"], check=True)
        constraints = ROOT / "requirements" / "constraints.txt"
        subprocess.run(
            [*pip, "-c", str(constraints), *PEER_REQUIREMENTS, "gymnasium[mujoco]==1.4.0", "mujoco==3.3.0"], check=True
        )
        (venv / ".installed").touch()
    return python


def sb3_run(
    python: Path,
    env_id: str,
    steps: int,
    seed: int,
    eval_every: int,
    out: Path,
    algo: Algo,
    peer: str = "sb3-zoo",
    view: dict | None = None,
) -> dict:
    result = out / f"{peer}_{seed}.json"
    if view is not None:
        import m2flow.workers.env  # noqa: F401  (its import picks the headless GL backend m2flow renders with)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if view is None:
        env.pop("MUJOCO_GL", None)  # nothing renders: MuJoCo needs no GL backend
    settings = PEER_KINDS[peer].settings
    arguments = [env_id, str(steps), str(seed), str(eval_every), str(result), algo.sb3, settings, json.dumps(view)]
    subprocess.run([str(python), str(Path(__file__).parent / "sb3_peer.py"), *arguments], check=True, env=env)
    data = json.loads(result.read_text())
    return {
        "implementation": peer,
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


def plot(runs: list[dict], path: Path, times_comparable: bool = True) -> None:
    """Evaluation return against env steps, and against wall time where the runs' times compare."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = ("steps", "wall_s") if times_comparable else ("steps",)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    palette = iter(["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"])
    colours = {name: next(palette) for name in dict.fromkeys(r["implementation"] for r in runs)}
    for run in runs:
        label = f"{run['implementation']} seed {run['seed']}"
        for ax, x in zip(axes[0], panels, strict=True):
            ax.plot(
                [p[x] for p in run["curve"]],
                [p["return"] for p in run["curve"]],
                color=colours[run["implementation"]],
                label=label,
            )
    for ax, x in zip(axes[0], panels, strict=True):
        ax.set_xlabel({"steps": "env steps", "wall_s": "wall seconds (training)"}[x])
        ax.set_ylabel("deterministic evaluation return")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def report(run: dict, steps: int) -> None:
    print(f"{run['implementation']} seed {run['seed']}: {at(run['curve'], steps):.0f} at {steps} steps", flush=True)


def summary_line(summary: dict, steps: int, seeds: int, times_comparable: bool = True) -> str:
    """m2flow's (or the first implementation's) return, then each other one's, with the time to 1,500 where
    the implementations ran on one machine."""

    def returns(name: str) -> str:
        of = summary[name]
        rate = f" ({of['steps_per_s']:.0f} steps/s)" if times_comparable else ""
        return f"{name} {of['return_mean']:.0f} ± {of['return_std']:.0f}{rate}"

    names = sorted(summary, key=lambda name: name != "m2flow")
    mine = summary[names[0]]
    line = f"learning: {returns(names[0])}"
    for name in names[1:]:
        peer = summary[name]
        line += f" vs {returns(name)}"
        ours, theirs = mine["time_to_1500_s"], peer["time_to_1500_s"]
        if not times_comparable:
            continue
        if None not in ours and None not in theirs:
            line += f"; time to 1500: {statistics.mean(theirs) / statistics.mean(ours):.1f}x faster"
        else:
            line += f"; time to 1500 (s): {names[0]} {ours}, {name} {theirs} (None: not reached)"
    apart = "" if times_comparable else "; returns only: not run side by side on one machine"
    return line + f" at {steps} steps ({seeds} seeds{apart})"


def merge(parts: list[str], same_conditions: bool = False, note: str | None = None) -> tuple[dict, list[dict], dict]:
    """The arguments, runs and `meta` of results written apart (m2flow on one machine and its peers on
    another, say). They must agree on the algorithm, env, step budget and evaluation interval, and every
    implementation must have the same seeds. Times compare only where the caller says the parts ran under the
    same conditions on one machine (`same_conditions`); otherwise only returns do (`times_comparable: false`).
    The merged `meta` names each implementation's machine and keeps each part's meta and arguments under
    `parts`; `note` says what else the reader should know of where they came from."""
    loaded, labels = {}, {}
    for spec in parts:  # `[LABEL=]FILE`: LABEL names the part's runs instead of their implementation
        label, _, part = spec.rpartition("=")
        loaded[part], labels[part] = json.loads(Path(part).read_text()), label
        for run in loaded[part]["runs"]:
            run["implementation"] = label or run["implementation"]
    given, parts = len(parts), list(loaded)
    same = ("algo", "env", "steps", "eval_every")  # each part's evaluation grid stays in its `meta` entry
    first = loaded[parts[0]]
    for part, result in loaded.items():
        differ = [key for key in same if result["args"][key] != first["args"][key]]
        if differ:
            raise SystemExit(f"learning.py --merge: {part} differs from {parts[0]} in {', '.join(differ)}")
    runs = [run for result in loaded.values() for run in result["runs"]]
    keys = [(run["implementation"], run["seed"]) for run in runs]
    if len(set(keys)) < len(keys) or len(parts) < given:
        raise SystemExit(f"learning.py --merge: a run is in more than one part: {sorted(keys)}")
    seeds = {name: sorted(seed for impl, seed in keys if impl == name) for name, _ in keys}
    if len({tuple(s) for s in seeds.values()}) > 1:
        raise SystemExit(f"learning.py --merge: the implementations ran different seeds: {seeds}")
    ran_on: dict[str, list[str]] = {}  # machine -> the implementations that ran there
    for result in loaded.values():
        for name in dict.fromkeys(run["implementation"] for run in result["runs"]):
            ran_on.setdefault(result["meta"]["machine"], []).append(name)
    one_machine = len(ran_on) == 1
    comparable = one_machine and same_conditions
    meta = {
        "commit": " and ".join(sorted({result["meta"]["commit"] for result in loaded.values()})),
        "date": max(result["meta"]["date"] for result in loaded.values()),
        "machine": " / ".join(f"{machine} ({'; '.join(dict.fromkeys(names))})" for machine, names in ran_on.items())
        if not one_machine
        else first["meta"]["machine"],
        "parts": [
            {"file": _shown(part), "label": labels[part], "args": result["args"], **result["meta"]}
            for part, result in loaded.items()
        ],
        **({"meta_source": note} if note else {}),
    }
    args = {key: first["args"][key] for key in same}
    grids = {result["args"].get("evaluation_grid") for result in loaded.values()}
    if len(grids) == 1 and None not in grids:  # the parts were evaluated on one grid: the result says which
        args["evaluation_grid"] = grids.pop()
    args |= {"seeds": sorted({run["seed"] for run in runs}), "times_comparable": comparable}
    return {**args, "merged": [_shown(part) for part in parts]}, runs, meta


def cut_at(recorded: dict, runs: list[dict], steps: int) -> tuple[dict, list[dict]]:
    """The comparison at `steps` env steps, where every run was evaluated: each curve's evaluations up to it (a
    run cut short compares there); the budget each part ran is kept as `ran_steps`."""
    if steps > recorded["steps"]:
        raise SystemExit(f"learning.py --at {steps}: beyond the {recorded['steps']} steps the parts ran")
    short = [f"{r['implementation']} seed {r['seed']}" for r in runs if all(p["steps"] != steps for p in r["curve"])]
    if short:
        raise SystemExit(f"learning.py --at {steps}: not evaluated at {steps} env steps: {', '.join(short)}")
    cut = [{**run, "curve": [p for p in run["curve"] if p["steps"] <= steps]} for run in runs]
    return {**recorded, "steps": steps, "ran_steps": recorded["steps"]}, cut


def _shown(path: str) -> str:
    """A part's path as the results record it: under benchmarks/results/ where it lies there, else its name."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(RESULTS)) if resolved.is_relative_to(RESULTS) else resolved.name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--algo", choices=sorted(ALGOS), default="ppo")
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--eval-every", type=int, default=10_000)
    parser.add_argument("--peers", nargs="*", choices=sorted(PEER_KINDS), default=["sb3-zoo"])
    parser.add_argument("--skip-peers", action="store_true", help="the same as --peers with none")
    parser.add_argument("--skip-m2flow", action="store_true", help="run only the peers")
    parser.add_argument("--peers-venv", default=str(Path(tempfile.gettempdir()) / "m2flow-peers"))
    parser.add_argument("--peers-python", help="an interpreter that already has the peers (no virtualenv made)")
    parser.add_argument("--config", help="m2flow's workflow in configs/ (default ppo_mujoco.yaml, sac_mujoco.yaml)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides of m2flow's config")
    parser.add_argument(
        "--merge", nargs="+", metavar="[LABEL=]PART", help="combine results written apart (LABEL renames their runs)"
    )
    parser.add_argument("--same-conditions", action="store_true", help="--merge: the parts' times compare")
    parser.add_argument("--note", help="--merge: where the parts came from, beyond their meta (shown in RESULTS.md)")
    parser.add_argument(
        "--at", type=int, help="--merge: compare at this many env steps (evaluations after it left out), fewer than run"
    )
    parser.add_argument("--name", help="the result's name (default learning_<env>)")
    args = parser.parse_args()
    peers = [] if args.skip_peers else args.peers
    if args.at and not args.merge:
        parser.error("--at compares merged parts: give --merge")
    if args.skip_m2flow and not peers and not args.merge:
        parser.error("--skip-m2flow with no --peers runs nothing")
    for peer in peers:
        if args.algo not in PEER_KINDS[peer].algos:
            parser.error(f"--peers {peer} has no {args.algo} settings (it has {', '.join(PEER_KINDS[peer].algos)})")
    meta = {}
    if args.merge:
        recorded, runs, meta = merge(args.merge, args.same_conditions, args.note)
        if args.at:
            recorded, runs = cut_at(recorded, runs, args.at)
        args.algo, args.env, args.steps, args.seeds = (recorded[k] for k in ("algo", "env", "steps", "seeds"))
    else:
        recorded, runs = vars(args), []
        algo = ALGOS[args.algo]
        with tempfile.TemporaryDirectory(prefix="m2flow-learning-") as tmp:
            preset = {"algo": algo, "config": args.config}
            grid = recorded["evaluation_grid"] = evaluation_grid(args.env, args.eval_every, args.set, **preset)
            view = recorded["view"] = camera_view(*m2flow_spec(args.env, 0, Path("."), args.set, **preset))
            for seed in [] if args.skip_m2flow else args.seeds:
                runs.append(m2flow_run(args.env, args.steps, seed, grid, Path(tmp), args.set, **preset))
                report(runs[-1], args.steps)
            if peers:
                python = Path(args.peers_python) if args.peers_python else peers_python(Path(args.peers_venv))
            for peer in peers:
                for seed in args.seeds:
                    runs.append(sb3_run(python, args.env, args.steps, seed, grid, Path(tmp), algo, peer, view))
                    report(runs[-1], args.steps)
    summary = summarise(runs, args.steps)
    algo_part = "" if args.algo == "ppo" else f"{args.algo}_"
    name = args.name or f"learning_{algo_part}{args.env.split('-')[0].lower()}"
    plot(runs, RESULTS / f"{name}.png", recorded.get("times_comparable", True))
    line = summary_line(summary, args.steps, len(args.seeds), recorded.get("times_comparable", True))
    save_result(name, {"args": recorded, "runs": runs, "summary": summary, "line": line, "meta": meta})
    print(line)


if __name__ == "__main__":
    main()
