"""Placement modes side by side on one workflow whose simulator and inference costs are comparable.

Synthetic spin workers (m2flow.workers.synthetic) with known costs, declared as the profile, run for
real through the executor in `shared`, `disaggregated`, `hybrid` (S=1, 2, 4) and `auto`. For each:
the planner's predicted iteration time, the measured one, env steps/s, the ratio to `shared`, and the
pipeline efficiency (the bound horizon * max(stage) over the measured loop time).

    python benchmarks/modes.py [--horizon 128] [--iterations 6] [--step-ms 4] [--act-ms 4] [--act-fixed-frac 0.1]
    python benchmarks/modes.py --workload camera [--policy vit --size 100m] [--modes shared:1,hybrid:2]
        [--transport object_store]   # the weight sync's transport (default: what the placement allows)
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path

from results_io import save_result

import m2flow as mf
from m2flow.config import spec_from_dict
from m2flow.errors import PlanError

SPIN_ENVS = 8


def spin_workflow(args: argparse.Namespace, mode: str, stages: int | str, out: Path) -> dict:
    step_per_env = args.step_ms / 1e3 / SPIN_ENVS
    act_fixed = args.act_ms / 1e3 * args.act_fixed_frac
    act_per_env = args.act_ms / 1e3 * (1 - args.act_fixed_frac) / SPIN_ENVS
    return {
        "name": f"modes-{mode}-{stages}",
        "workers": {
            "env": {
                "kind": "simulator",
                "class": "m2flow.workers.synthetic.SpinSimulator",
                "args": {"num_envs": SPIN_ENVS, "per_env_s": step_per_env},
                "profile": {"step": {"per_item_s": step_per_env}, "obs": {"fixed_s": 1e-4}},
            },
            "policy": {
                "kind": "inference",
                "class": "m2flow.workers.synthetic.SpinPolicy",
                "args": {"fixed_s": act_fixed, "per_env_s": act_per_env},
                "profile": {"act": {"fixed_s": act_fixed, "per_item_s": act_per_env}},
            },
            "trainer": {
                "kind": "training",
                "class": "m2flow.workers.synthetic.SpinTrainer",
                "args": {"fixed_s": args.train_ms / 1e3},
                "profile": {"train": {"fixed_s": args.train_ms / 1e3}},
            },
        },
        "flow": {
            "loop": {"horizon": args.horizon, "edges": ["env.obs -> policy.act", "policy.act -> env.step"]},
            "then": ["env.trajectory -> trainer.train"],
            "sync": [{"edge": "trainer.weights -> policy.load_weights", "transport": args.transport}],
        },
        "placement": {"mode": mode, "pipeline_stages": stages, "colocate": False},  # as the recorded runs
        "run": run_settings(args, out),
    }


def camera_workflow(args: argparse.Namespace, mode: str, stages: int | str, out: Path) -> dict:
    """Simulators with a rendered camera on CPU cores; a CNN policy (or a ViT preset, acting and trained in
    bf16) and PPO on the GPU when there is one."""
    view = {"cameras": ["track"], "modalities": ["rgb", "proprio"], "size": [84, 84]}
    model = {"model": "cnn", "hidden": [256]}
    training = {"num_minibatches": 4, "update_epochs": 2}
    if args.policy == "vit":
        model = {"model": "vit", "size": args.size, "patch": 12, "causal": True, "precision": "bf16"}
        samples = args.replicas * args.envs * args.horizon
        training = {"num_minibatches": max(2, samples // args.minibatch), "update_epochs": 1}
    policy = {"env_id": "HalfCheetah-v5", **model, "chunk": args.chunk, "observation": view}
    flow = {
        "loop": {"horizon": args.horizon, "edges": ["env.obs -> rollout.act", "rollout.act -> env.step"]},
        "then": ["env.trajectory -> actor.train"],
        "sync": [{"edge": "actor.weights -> rollout.load_weights", "transport": args.transport}],
    }
    if args.staleness:  # training beside the next loop, on batches that many policy versions behind
        flow["async"] = {"max_staleness": args.staleness, "on_stale": "block"}
        training = {**training, "off_policy": "decoupled", "behavior_weight_cap": 2.0}
    return {
        "name": f"modes-camera-{mode}-{stages}",
        "workers": {
            "env": {
                "kind": "simulator",
                "class": "m2flow.workers.env.CameraEnv",
                "replicas": args.replicas,
                "args": {"env_id": "HalfCheetah-v5", "num_envs": args.envs, "chunk": args.chunk, "observation": view},
            },
            "rollout": {"kind": "inference", "class": "m2flow.workers.rollout.TorchPolicy", "args": policy},
            "actor": {
                "kind": "training",
                "class": "m2flow.workers.actor.PPO",
                "args": {**policy, **training},
            },
        },
        "flow": flow,
        "placement": {"mode": mode, "pipeline_stages": stages, "offload": args.offload, "colocate": False},
        "run": run_settings(args, out),
    }


WORKLOADS = {"spin": spin_workflow, "camera": camera_workflow}
MODES = ("shared:1", "disaggregated:1", "hybrid:1", "hybrid:2", "hybrid:4", "auto:auto")


def run_settings(args: argparse.Namespace, out: Path) -> dict:
    return {
        "iterations": args.iterations,
        "output_dir": str(out),
        "progress": False,
        "checkpoint_every": 0,
        "trace_detail_iterations": 1,
        "timeouts": {"floor_s": 300},
    }


def workflow(args: argparse.Namespace, mode: str, stages: int | str, out: Path) -> mf.WorkflowSpec:
    raw = WORKLOADS[args.workload](args, mode, stages, out)
    if args.profile:
        raw["placement"]["profile"] = str(args.profile)
    return spec_from_dict(raw)


def measure(spec: mf.WorkflowSpec, args: argparse.Namespace) -> dict:
    result = mf.run(spec)
    rows = result.history[1:]
    if args.staleness:  # its asynchronous iterations (a run that measured costs ran its first ones synchronously)
        rows = [h for h in result.history if "async/collected_at" in h][1:]
    rows = [h for h in rows if "time/loop_s" in h]  # an async run ends with an update alone
    iteration = statistics.median(h["time/iteration_s"] for h in rows)
    loop = statistics.median(h["time/loop_s"] for h in rows)
    sync = statistics.median(h.get("time/sync_s", 0.0) for h in rows)
    physics, render = (
        statistics.median(h.get(f"env/{part}_s", math.nan) for h in rows) for part in ("physics", "render")
    )
    bound = args.horizon * max(args.step_ms, args.act_ms) / 1e3 if args.workload == "spin" else float("nan")
    return {
        "mode": result.plan.mode,
        "stages": result.plan.pipeline_stages,
        "predicted_s": result.plan.predicted.iteration_s,
        "measured_s": iteration,
        "env_steps_per_s": result.history[-1]["env_steps"] / len(result.history) / iteration,
        "pipeline_efficiency": bound / loop,
        "loop_s": loop,
        "sync_s": sync,
        "physics_s": physics * result.plan.pipeline_stages,  # per simulator replica (its slices summed) and iteration
        "render_s": render * result.plan.pipeline_stages,
        "transport": next(iter(result.plan.transports.values()), None),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--horizon", type=int, default=128)
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--step-ms", type=float, default=4.0, help="simulator step of all envs")
    parser.add_argument("--act-ms", type=float, default=4.0, help="policy call for all envs")
    parser.add_argument("--act-fixed-frac", type=float, default=0.1, help="share of a policy call paid per call")
    parser.add_argument("--train-ms", type=float, default=20.0)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="spin")
    parser.add_argument("--replicas", type=int, default=4, help="camera workload: simulator processes")
    parser.add_argument("--envs", type=int, default=8, help="camera workload: envs per simulator process")
    parser.add_argument("--offload", default="auto", choices=["auto", "always", "never"])
    parser.add_argument("--measure", action="store_true", help="run `m2flow profile` first and plan with it")
    parser.add_argument("--staleness", type=int, default=0, help="camera workload: train asynchronously, k-off")
    parser.add_argument("--chunk", type=int, default=1, help="camera workload: actions per policy call")
    parser.add_argument("--policy", choices=["cnn", "vit"], default="cnn", help="camera workload: the policy")
    parser.add_argument("--size", default="100m", help="camera workload with --policy vit: the ViT preset")
    parser.add_argument("--minibatch", type=int, default=2048, help="--policy vit: samples a minibatch")
    parser.add_argument("--transport", default="auto", help="the weight sync edge's transport")
    parser.add_argument("--modes", default=",".join(MODES), help="mode:stages pairs, comma-separated")
    parser.add_argument("--name", help="results file name (default modes_<workload>)")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()

    import ray

    ray.init(address="local", include_dashboard=False, log_to_driver=False)
    out = Path(args.out)
    args.profile = None
    if args.measure:
        from m2flow.planners.fit import save_profile
        from m2flow.runtime.profiling import measure_profile

        args.profile = save_profile(
            measure_profile(workflow(args, "auto", "auto", out / "tmp")), out / "tmp" / f"{args.workload}-profile.json"
        )
        print(f"measured profile: {args.profile}", flush=True)
    rows = []
    for mode, stages in (pair.split(":") for pair in args.modes.split(",")):
        stages = int(stages) if stages.isdigit() else stages
        label = f"{mode} S={stages}"
        try:
            row = measure(workflow(args, mode, stages, out / "tmp"), args)
        except PlanError as exc:
            print(f"{label:18s} infeasible here: {str(exc).splitlines()[0]}", flush=True)
            rows.append({"mode": mode, "stages": stages, "infeasible": str(exc)})
            continue
        row["label"] = label if mode != "auto" else f"auto -> {row['mode']} S={row['stages']}"
        rows.append(row)
    ran = [r for r in rows if "measured_s" in r]
    if not ran:
        raise SystemExit("modes: no mode could run on this machine (see the reasons above)")
    shared = next((r for r in ran if r["mode"] == "shared"), ran[0])  # the baseline: shared, if it ran
    print(
        f"\n{'mode':24s} {'predicted s':>11s} {'measured s':>10s} {'error':>7s} {'steps/s':>8s} {'vs shared':>9s}"
        f" {'pipeline eff':>12s} {'loop s':>7s} {'sync s':>7s} {'physics s':>9s} {'render s':>8s} transport"
    )
    for row in rows:
        if "measured_s" not in row:
            continue
        row["vs_shared"] = shared["measured_s"] / row["measured_s"]
        row["error"] = row["measured_s"] / row["predicted_s"] - 1
        print(
            f"{row['label']:24s} {row['predicted_s']:11.3f} {row['measured_s']:10.3f} {row['error']:+7.1%}"
            f" {row['env_steps_per_s']:8.0f} {row['vs_shared']:8.2f}x {row['pipeline_efficiency']:12.2f}"
            f" {row['loop_s']:7.3f} {row['sync_s']:7.3f} {row.get('physics_s', math.nan):9.3f}"
            f" {row.get('render_s', math.nan):8.3f} {row['transport']}"
        )
    name = args.name or f"modes_{args.workload}"
    save_result(name, {"args": {**vars(args), "profile": str(args.profile)}, "rows": rows}, out)
    measured = [r for r in rows if "measured_s" in r and not r["label"].startswith("auto")]
    fastest = min(measured, key=lambda r: r["measured_s"])
    auto = next((r for r in rows if r.get("label", "").startswith("auto")), None)
    if auto is not None:
        same = (auto["mode"], auto["stages"]) == (fastest["mode"], fastest["stages"])
        picked = "fastest" if same else "not fastest"
        print(f"\nauto picked {auto['mode']} S={auto['stages']} ({picked}: fastest measured {fastest['label']})")
    hybrids = [r for r in measured if r["mode"] == "hybrid"]
    if hybrids:
        best = max(hybrids, key=lambda r: r["vs_shared"])
        print(f"hybrid/shared: {best['vs_shared']:.2f}x ({best['label']}, prediction error {best['error']:+.1%})")
    else:
        print(f"{fastest['label']}: {fastest['measured_s']:.3f} s/iteration, sync {fastest['sync_s']:.3f} s")


if __name__ == "__main__":
    main()
