"""The BEHAVIOR ablation, here: what each simulator-side optimisation buys on a camera task with a CNN
policy in an inference worker, all rows run through m2flow side by side in one process.

rows (cumulative):  baseline       full rendering, every camera and modality, observations every step
                    slim           fast rendering, only RGB of the cameras the policy reads (+ proprio)
                    + chunk end    observations only at the end of each C-action chunk
                    + pipeline     S slices, simulator and inference on separate cores (hybrid)

    python benchmarks/simulator_ablation.py [--task metaworld|cheetah] [--envs 2] [--chunks 4] [--chunk 8]
        [--replicas 1] [--policy cnn|vit] [--iterations 2] [--first-row baseline|slim|chunk-end] [--stages 2 [4 ...]]

Each row's figure is the median loop time over the iterations after the first, per env step. `--first-row` skips
the rows before it (the baseline renders everything every step: long horizons make it take minutes an iteration);
the cumulative column is then against the first row run. `--stages` runs a pipeline row for each stage count, each
against the chunk-end row.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from results_io import save_result

import m2flow as mf
from m2flow.config import spec_from_dict

TASKS = {  # env id, env kwargs, every camera the model has, the cameras the policy reads
    "metaworld": (
        "Meta-World/MT1",
        {"env_name": "reach-v3"},
        ["corner", "gripperPOV", "topview"],
        ["corner", "gripperPOV"],
    ),
    "cheetah": ("HalfCheetah-v5", {}, ["track"], ["track"]),
}
FIRST_ROWS = {"baseline": 0, "slim": 1, "chunk-end": 2}  # --first-row: the index of that row in rows()
PUBLISHED = {"slim": 4.8, "+ chunk end": 3.3, "+ pipeline": 1.6}  # RLinf's BEHAVIOR study; 25x in all


def rows(task: str, stages: list[int]) -> list[tuple[str, dict, str, int]]:
    _, _, every_camera, reads = TASKS[task]
    baseline = {
        "render_profile": "full",
        "obs_every_step": True,
        "observation": {"cameras": every_camera, "modalities": ["rgb", "depth", "segmentation", "proprio"]},
    }
    slim = {
        "render_profile": "fast",
        "obs_every_step": True,
        "observation": {"cameras": reads, "modalities": ["rgb", "proprio"]},
    }
    return [
        ("baseline", baseline, "shared", 1),
        ("slim", slim, "shared", 1),
        ("+ chunk end", {**slim, "obs_every_step": False}, "shared", 1),
    ] + [("+ pipeline", {**slim, "obs_every_step": False}, "hybrid", s) for s in stages]


def workflow(args: argparse.Namespace, name: str, sim: dict, mode: str, stages: int, out: Path) -> mf.WorkflowSpec:
    env_id, env_kwargs, _, reads = TASKS[args.task]
    size = [args.size, args.size]
    sim = {**sim, "observation": {**sim["observation"], "size": size}}
    model = {"model": "cnn", "hidden": [256]}
    if args.policy == "vit":  # the GPU pipeline workload's policy (configs/ppo_camera_gpu.yaml)
        model = {"model": "vit", "size": args.vit_size, "patch": 12, "causal": True, "precision": "bf16"}
    policy = {
        "env_id": env_id,
        "env_kwargs": env_kwargs,
        **model,
        "chunk": args.chunk,
        "observation": {"cameras": reads, "modalities": ["rgb", "proprio"], "size": size},
    }
    return spec_from_dict(
        {
            "name": name,
            "workers": {
                "env": {
                    "kind": "simulator",
                    "class": "m2flow.workers.env.CameraEnv",
                    "replicas": args.replicas,
                    "args": {
                        "env_id": env_id,
                        "env_kwargs": env_kwargs,
                        "num_envs": args.envs,
                        "chunk": args.chunk,
                        **sim,
                    },
                },
                "policy": {"kind": "inference", "class": "m2flow.workers.rollout.TorchPolicy", "args": policy},
            },
            "flow": {"loop": {"horizon": args.chunks, "edges": ["env.obs -> policy.act", "policy.act -> env.step"]}},
            "placement": {"mode": mode, "pipeline_stages": stages},
            "run": {
                "iterations": args.iterations,
                "output_dir": str(out),
                "progress": False,
                "checkpoint_every": 0,
                "trace_detail_iterations": 0,
                "timeouts": {"floor_s": 600},  # the baseline row renders everything every step: slow by design
            },
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=sorted(TASKS), default="metaworld")
    parser.add_argument("--envs", type=int, default=2, help="envs per simulator process")
    parser.add_argument("--replicas", type=int, default=1, help="simulator processes")
    parser.add_argument("--policy", choices=["cnn", "vit"], default="cnn", help="vit: acting in bf16 (a GPU's job)")
    parser.add_argument("--vit-size", default="100m", help="with --policy vit: the ViT preset")
    parser.add_argument("--chunks", type=int, default=4, help="policy calls (chunks) per iteration")
    parser.add_argument("--chunk", type=int, default=8, help="actions per chunk")
    parser.add_argument("--size", type=int, default=84)
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--first-row", choices=sorted(FIRST_ROWS), default="baseline", help="skip the rows before it")
    parser.add_argument("--stages", type=int, nargs="+", default=[2], help="a pipeline row for each stage count")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()

    import ray

    ray.init(address="local", include_dashboard=False, log_to_driver=False)
    out = Path(args.out)
    results, previous = [], None
    print(
        f"{args.task}: {args.replicas} x {args.envs} envs, {args.chunks} chunks of {args.chunk} actions per iteration",
        flush=True,
    )
    for label, sim, mode, stages in rows(args.task, args.stages)[FIRST_ROWS[args.first_row] :]:
        run = mf.run(workflow(args, f"ablation-{len(results)}", sim, mode, stages, out / "tmp"))
        loop_s = statistics.median(h["time/loop_s"] for h in run.history[1:] or run.history)
        ms = 1e3 * loop_s / (args.chunks * args.chunk * args.envs * args.replicas)
        speedup = previous / ms if previous else 1.0
        cumulative = results[0]["ms_per_step"] / ms if results else 1.0
        results.append(
            {
                "row": label,
                "stages": stages,
                "ms_per_step": ms,
                "speedup": speedup,
                "cumulative": cumulative,
                "published": PUBLISHED.get(label),
            }
        )
        row, against = (f"{label} S={stages}", "chunk-end") if mode == "hybrid" else (label, "previous")
        print(
            f"{row:14s} {ms:9.2f} ms/env step   x{speedup:5.2f} over the {against} row   (x{cumulative:.2f} in all;"
            f" BEHAVIOR: {PUBLISHED.get(label, '-')})",
            flush=True,
        )
        previous = previous if mode == "hybrid" else ms  # each pipeline row against the chunk-end row
    name = f"simulator_ablation_{args.task}" + ("" if args.policy == "cnn" else f"_{args.policy}")
    save_result(name, {"args": vars(args), "rows": results}, out)
    pipelines = ", ".join(f"S={r['stages']} {r['cumulative']:.2f}x" for r in results if r["row"] == "+ pipeline")
    if args.first_row == "baseline":
        print(f"total: {pipelines} ({args.task}; BEHAVIOR published 25x)")
    else:
        print(f"from the {args.first_row} row: {pipelines} ({args.task})")


if __name__ == "__main__":
    main()
