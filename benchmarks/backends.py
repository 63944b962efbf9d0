"""Training backends side by side: samples/s and peak device memory of one PPO update of a ViT policy,
FSDP2 vs Megatron-core (GPTModel trunk), at two policy sizes, fp32 vs bf16; plus activation
checkpointing and CPU offload rows. Before timing, a parity check: the Megatron GPT trunk built from a
ViT policy computes the same actions and values, and its gathered weights load into the plain policy.

One process, one training rank (the lent machine has one GPU). On a CPU-only machine only the FSDP rows
run (GPTModel needs CUDA), at the sizes given.

    python benchmarks/backends.py [--sizes 10m 100m] [--steps 16] [--envs 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import traceback
from pathlib import Path

import torch
from results_io import save_result
from update_timing import seconds_per_update

from m2flow.context import WorkerContext, set_context
from m2flow.workers.actor import PPO
from m2flow.workers.models import PolicyArgs
from m2flow.workers.synthetic import SyntheticBatch

VIEW = {"cameras": ["track"], "modalities": ["rgb", "proprio"], "size": (64, 64)}
ENV = "HalfCheetah-v5"  # 17-dim proprioception, 6-dim actions


def batch(steps: int, envs: int, seed: int = 0) -> dict:
    return SyntheticBatch(steps, envs, seed=seed).trajectory()


def ppo(device: str, backend: str, size: str, **options) -> PPO:
    set_context(WorkerContext(worker="actor", kind="training", device=device, backend=backend, seed=1))
    return PPO(
        env_id=ENV,
        model="vit",
        observation=VIEW,
        size=size,
        causal=True,  # a GPT trunk is causal; both backends run the same policy
        num_minibatches=4,
        update_epochs=1,
        normalize_reward=False,
        **options,
    )


def parity(device: str) -> dict:
    """The Megatron GPT trunk vs the plain ViT policy it was built from: outputs, and gathered weights."""
    fsdp, megatron = ppo(device, "fsdp", "1m"), ppo(device, "megatron", "1m")
    data = batch(2, 8, seed=3)
    obs = fsdp.model.inputs({k: v[0] for k, v in data["obs"].items()}, fsdp.device)
    with torch.no_grad():
        a = fsdp.model.get_action_and_value(obs, torch.zeros(8, 6, device=fsdp.device))
        b = megatron.model.get_action_and_value(obs, torch.zeros(8, 6, device=megatron.device))
        plain = PolicyArgs(env_id=ENV, model="vit", observation=VIEW, size="1m", causal=True).build().to(fsdp.device)
        plain.load_state_dict(megatron.backend.full_state_dict(megatron.model))
        c = plain.get_action_and_value(obs, torch.zeros(8, 6, device=fsdp.device))
    diff = {
        "logprob": float((a[1] - b[1]).abs().max()),
        "value": float((a[3] - b[3]).abs().max()),
        "synced_logprob": float((a[1] - c[1]).abs().max()),
        "synced_value": float((a[3] - c[3]).abs().max()),
    }
    del fsdp, megatron
    return diff


def measure(device: str, backend: str, size: str, data: dict, repeats: int, **options) -> dict:
    cuda = device.startswith("cuda")
    trainer = ppo(device, backend, size, **options)
    params = sum(p.numel() for p in trainer.model.parameters())
    seconds = seconds_per_update(trainer, data, repeats, cuda)
    samples = data["reward"].size
    row = {
        "backend": backend,
        "size": size,
        "params_m": params / 1e6,
        "precision": options.get("precision", "fp32"),
        "options": ",".join(k for k, v in options.items() if v is True) or "-",
        "update_s": seconds,
        "samples_per_s": samples / seconds,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan"),
    }
    del trainer
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return row


def configurations(cuda: bool, sizes: list[str]) -> list[tuple[str, str, dict]]:
    backends = ["fsdp", "megatron"] if cuda else ["fsdp"]
    rows = [(b, s, {"precision": p}) for s in sizes for b in backends for p in ("fp32", "bf16")]
    large = sizes[-1]
    rows.append(("fsdp", large, {"precision": "bf16", "activation_checkpointing": True}))
    if cuda:
        rows.append(("megatron", large, {"precision": "bf16", "activation_checkpointing": True}))
        rows.append(("fsdp", large, {"precision": "bf16", "cpu_offload": True}))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["10m", "100m"])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--envs", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", help="run only the rows with this option (e.g. cpu_offload)")
    parser.add_argument("--out", default="benchmarks/results/backends.json", help="the results file to write")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = "cuda:0" if cuda else "cpu"
    machine = torch.cuda.get_device_name(0) if cuda else platform.processor() or platform.machine()
    print(f"backends: one PPO update ({args.steps} steps x {args.envs} envs, 4 minibatches) on {machine}")
    result: dict = {"rows": []}
    if cuda and args.only is None:
        try:
            result["parity"] = parity(device)
            print("parity, Megatron GPT trunk vs plain ViT (max |diff|):", json.dumps(result["parity"]))
        except Exception:  # report and go on: the timing rows are still worth having
            result["parity"] = traceback.format_exc()
            print("parity check FAILED:\n" + result["parity"])
    data = batch(args.steps, args.envs)
    header = (
        f"{'backend':9} {'size':5} {'params':>8} {'prec':5} {'options':26} {'update':>9} {'samples/s':>10} {'peak':>9}"
    )
    print(header)
    rows = configurations(cuda, args.sizes)
    for backend, size, options in [r for r in rows if args.only is None or args.only in r[2]]:
        try:
            row = measure(device, backend, size, data, args.repeats, **options)
        except Exception as exc:
            print(f"{backend:9} {size:5} {options} FAILED: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
            gc.collect()
            continue
        result["rows"].append(row)
        print(
            f"{row['backend']:9} {row['size']:5} {row['params_m']:7.1f}M {row['precision']:5} {row['options']:26}"
            f" {row['update_s']:8.3f}s {row['samples_per_s']:10.0f} {row['peak_gib']:8.2f}G",
            flush=True,
        )
    out = Path(args.out)
    save_result(out.name.removesuffix(".json"), result, out.parent)
    print(summary(result["rows"], args.sizes[-1]))


def summary(rows: list[dict], size: str) -> str:
    def rate(backend: str, precision: str) -> float | None:
        for r in rows:
            if (r["backend"], r["size"], r["precision"], r["options"]) == (backend, size, precision, "-"):
                return r["samples_per_s"]
        return None

    parts = []
    fp32, bf16, megatron = rate("fsdp", "fp32"), rate("fsdp", "bf16"), rate("megatron", "bf16")
    if fp32 and bf16:
        parts.append(f"fsdp bf16/fp32 ({size}): {bf16 / fp32:.2f}x")
    if megatron and bf16:
        parts.append(f"megatron/fsdp ({size}, bf16): {megatron / bf16:.2f}x")
    if not parts:  # e.g. `--only cpu_offload`: no plain rows to compare with
        parts = [
            f"{r['backend']} {r['size']} {r['precision']} {r['options']}: {r['update_s']:.3f} s/update" for r in rows
        ]
    return "summary: " + (", ".join(parts) or "no row measured")


if __name__ == "__main__":
    main()
