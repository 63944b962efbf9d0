"""Training across GPUs through the executor: FSDP2 data parallel and Megatron tensor parallel on 1 and
N ranks (one GPU each), the same fixed batch every iteration. Per configuration: the update's time and
samples/s (median over iterations after the first), the speed-up over one rank, and the largest weight
difference from the one-rank run of the same backend after the same updates (equal up to the order of
floating-point reductions).

    python benchmarks/multigpu.py [--gpus 2] [--size 100m] [--iterations 4]
    python benchmarks/multigpu.py --policy hf [--size 0.7b]   # a VLM-shaped Hugging Face policy in bf16, FSDP2 only
"""

from __future__ import annotations

import argparse
import statistics
import traceback
from pathlib import Path

import torch
from results_io import save_result

import m2flow as mf
from m2flow.config import spec_from_dict
from m2flow.runtime.checkpoint import latest_checkpoint
from m2flow.workers.actor import read_checkpoint

VIEW = {"cameras": ["track"], "modalities": ["rgb", "proprio"], "size": [64, 64]}


def policy_of(args: argparse.Namespace, out: Path) -> dict:
    """The ViT preset, or a random VLM of the given size written to a local folder (`model: hf`, bf16)."""
    if args.policy == "vit":
        return {"env_id": "HalfCheetah-v5", "model": "vit", "size": args.size, "causal": True, "observation": VIEW}
    from m2flow.workers.models.hf_tiny import SIZES, make_tiny_vlm

    folder = out / f"vlm-{args.size}"
    if not (folder / "config.json").exists():
        make_tiny_vlm(folder, args.size)
    image = SIZES[args.size]["image_size"]
    view = {"cameras": ["track"], "modalities": ["rgb"], "size": [image, image]}
    hf = {"path": str(folder), "dtype": "bf16"}
    return {"env_id": "HalfCheetah-v5", "model": "hf", "observation": view, "hf": hf}


def workflow(backend: str, ranks: int, args: argparse.Namespace, out: Path) -> mf.WorkflowSpec:
    policy = policy_of(args, out)
    return spec_from_dict(
        {
            "name": f"multigpu-{backend}-{ranks}",
            "workers": {
                "data": {
                    "kind": "function",
                    "class": "m2flow.workers.synthetic.SyntheticBatch",
                    "replicas": ranks if backend == "fsdp" else 1,  # one shard per data-parallel rank
                    "args": {"steps": args.steps, "envs": args.envs, "size": policy["observation"]["size"]},
                },
                "actor": {
                    "kind": "training",
                    "class": "m2flow.workers.actor.PPO",
                    "backend": backend,
                    "replicas": ranks,
                    "args": {**policy, "num_minibatches": 4, "update_epochs": 1, "normalize_reward": False},
                },
            },
            "flow": {"then": ["data.trajectory -> actor.train"]},
            "placement": {"mode": "disaggregated"},
            "run": {"iterations": args.iterations, "seed": 3, "output_dir": str(out), "progress": False},
        }
    )


def run(backend: str, ranks: int, args: argparse.Namespace, out: Path) -> dict:
    result = mf.run(workflow(backend, ranks, args, out))
    seconds = statistics.median(h["time/then_s"] for h in result.history[1:])
    state = read_checkpoint(latest_checkpoint(result.run_dir / "checkpoints") / "actor")["model"]
    devices = sorted({d.name for d in result.plan.placements["actor"].replica_devices})
    return {
        "backend": backend,
        "ranks": ranks,
        "devices": devices,
        "update_s": seconds,
        "samples_per_s": args.steps * args.envs / seconds,
        "loss": result.last["actor/loss"],
        "state": state,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpus", type=int, default=torch.cuda.device_count())
    parser.add_argument("--size", help="vit: a ViT preset (default 100m); hf: an hf_tiny size (default 0.7b)")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--envs", type=int, default=64)
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--policy", choices=["vit", "hf"], default="vit")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    args.size = args.size or {"vit": "100m", "hf": "0.7b"}[args.policy]
    out = Path(args.out)
    print(f"multigpu: {args.policy} {args.size}, {args.steps * args.envs} samples a batch, 1 and {args.gpus} ranks")
    rows, states = [], {}
    for backend in ("fsdp", "megatron") if args.policy == "vit" else ("fsdp",):
        for ranks in (1, args.gpus):
            try:
                row = run(backend, ranks, args, out / "tmp")
            except Exception as exc:  # report and go on: the other rows are still worth having
                print(f"{backend} x{ranks} FAILED: {type(exc).__name__}: {exc}\n{traceback.format_exc()}", flush=True)
                continue
            states[(backend, ranks)] = row.pop("state")
            one = states.get((backend, 1))
            if one is not None:
                row["max_abs_diff_vs_1"] = max(
                    float((states[(backend, ranks)][k] - v).abs().max()) for k, v in one.items()
                )
                base = next(r for r in rows if (r["backend"], r["ranks"]) == (backend, 1)) if ranks > 1 else row
                row["speedup_vs_1"] = row["samples_per_s"] / base["samples_per_s"]
            rows.append(row)
            print(
                f"{backend:9} x{ranks} on {','.join(row['devices'])}: {row['update_s']:.3f} s/update,"
                f" {row['samples_per_s']:.0f} samples/s, {row.get('speedup_vs_1', float('nan')):.2f}x vs 1,"
                f" max |w - w_1| {row.get('max_abs_diff_vs_1', float('nan')):.2e}, loss {row['loss']:.4f}",
                flush=True,
            )
    name = "multigpu" if args.policy == "vit" else "multigpu_hf"
    save_result(name, {"gpus": args.gpus, "policy": args.policy, "size": args.size, "rows": rows}, out)
    scaled = {r["backend"]: r.get("speedup_vs_1") for r in rows if r["ranks"] == args.gpus}
    parts = [f"{b} {args.gpus} GPUs/1: {s:.2f}x" for b, s in scaled.items() if s]
    print("summary: " + (", ".join(parts) or f"no {args.gpus}-rank run measured against one rank"))


if __name__ == "__main__":
    main()
