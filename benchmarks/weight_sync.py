"""Weight sync of a large policy through the executor, by transport: the same workflow (a PPO actor
trained on a fixed batch, its weights synced to an inference replica every iteration) run once per
transport the placement allows, side by side. Per transport: the sync phase's seconds per iteration
(median after the first; `actor.weights`, the transfer and `rollout.load_weights`), its share of the
iteration, the bytes moved, and that the rollout loaded every version; and from the run's trace, where the sync
goes: the source's part (its port, packing, handles) and the destination's (receiving, checking, loading).

    python benchmarks/weight_sync.py [--size 100m] [--iterations 5]

One GPU: actor and rollout share it (object_store vs cuda_ipc). Two or more: GPU 0 and GPU 1 (object_store
vs collective over NCCL). No GPU: two CPU slots (object_store vs collective over gloo).
Last line: `weight sync <params>: <fast>/object_store <x>x (<ms> ms vs <ms> ms)`.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
from results_io import save_result

import m2flow as mf
from m2flow.config import spec_from_dict

VIEW = {"cameras": ["track"], "modalities": ["rgb", "proprio"], "size": [64, 64]}


def workflow(transport: str, gpus: int, args: argparse.Namespace, out: Path) -> mf.WorkflowSpec:
    policy = {"env_id": "HalfCheetah-v5", "model": "vit", "size": args.size, "causal": True, "observation": VIEW}
    return spec_from_dict(
        {
            "name": f"weight-sync-{transport}",
            "workers": {
                "data": {
                    "kind": "function",
                    "class": "m2flow.workers.synthetic.SyntheticBatch",
                    "args": {"steps": 8, "envs": 16, "size": VIEW["size"]},
                },
                "actor": {
                    "kind": "training",
                    "class": "m2flow.workers.actor.PPO",
                    "args": {**policy, "num_minibatches": 1, "update_epochs": 1, "normalize_reward": False},
                },
                "rollout": {"kind": "inference", "class": "m2flow.workers.rollout.TorchPolicy", "args": policy},
            },
            "flow": {
                "then": ["data.trajectory -> actor.train"],
                "sync": [{"edge": "actor.weights -> rollout.load_weights", "transport": transport}],
            },
            "placement": placement(gpus),
            "cluster": {"gpus": min(gpus, 2)} if gpus else {"gpus": 0, "cpus": 2},
            "run": {"iterations": args.iterations, "seed": 3, "output_dir": str(out), "progress": False},
        }
    )


def placement(gpus: int) -> dict:
    """Actor and rollout share the GPU (or the CPU slots); with two GPUs or more, one GPU each."""
    if gpus <= 1:
        return {"mode": "shared", "offload": "never"}
    return {"devices": {"data": 0, "actor": 0, "rollout": 1}, "offload": "never"}


def span_s(run_dir: Path, name: str) -> float:
    """The median span of the trace's `name` tasks after the first iteration, in seconds."""
    events = json.loads((run_dir / "trace.json").read_text())["traceEvents"]
    spans = [e["dur"] / 1e6 for e in events if e["ph"] == "X" and e["name"] == name and e["args"]["iteration"] > 0]
    return statistics.median(spans)


def measure(transport: str, gpus: int, args: argparse.Namespace, out: Path) -> dict:
    result = mf.run(workflow(transport, gpus, args, out))
    later = result.history[1:]
    sync_s = statistics.median(h["time/sync_s"] for h in later)
    iteration_s = statistics.median(h["time/iteration_s"] for h in later)
    versions = [int(h["actor/weights_version"]) for h in result.history]
    return {
        "transport": result.plan.transports["actor.weights -> rollout.load_weights"],
        "devices": {w: [d.name for d in p.replica_devices] for w, p in result.plan.placements.items()},
        "sync_s": sync_s,
        "iteration_s": iteration_s,
        "sync_share": sync_s / iteration_s,
        "source_s": span_s(result.run_dir, "weights"),
        "destination_s": span_s(result.run_dir, "load_weights"),
        "bytes": result.last["sync/bytes"],
        "versions": versions,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="100m", help="the ViT preset of actor and rollout")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    gpus = torch.cuda.device_count()
    fast = "cuda_ipc" if gpus == 1 else "collective"
    print(f"weight sync: ViT {args.size}, {gpus} GPU(s): object_store vs {fast}")
    rows = []
    for transport in ("object_store", fast):
        row = measure(transport, gpus, args, Path(args.out) / "tmp")
        rows.append(row)
        print(
            f"{row['transport']:12} {row['sync_s'] * 1e3:8.1f} ms/sync (source {row['source_s'] * 1e3:.1f} ms,"
            f" destination {row['destination_s'] * 1e3:.1f} ms), {row['sync_share']:.1%} of a"
            f" {row['iteration_s']:.3f} s iteration, {row['bytes'] / 2**20:.0f} MiB, versions {row['versions']}",
            flush=True,
        )
    base, quick = rows
    speedup = base["sync_s"] / quick["sync_s"]
    save_result("weight_sync", {"gpus": gpus, "size": args.size, "rows": rows, "speedup": speedup}, args.out)
    print(
        f"weight sync {args.size}: {quick['transport']}/object_store {speedup:.1f}x"
        f" ({quick['sync_s'] * 1e3:.1f} ms vs {base['sync_s'] * 1e3:.1f} ms)"
    )


if __name__ == "__main__":
    main()
