"""A VLM-shaped Hugging Face policy (`model: hf`) under PPO on a GPU: samples/s and peak memory of one
update, fp32 vs bf16, full fine-tuning vs LoRA, with and without activation checkpointing; and the
inference worker's act() latency on a camera batch. The model is random weights from a config
(`m2flow.workers.models.hf_tiny`, size `0.7b`: ~0.7B parameters), written to a local folder: no hub.

    python benchmarks/hf_policy.py [--size 0.7b] [--steps 4] [--envs 16] [--repeats 3]

Last line: `hf policy (<params>): bf16/fp32 <x>x, lora/full (bf16) <y>x samples/s`.
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
import traceback
from pathlib import Path

import torch
from results_io import save_result
from update_timing import seconds_per_update

from m2flow.context import WorkerContext, set_context
from m2flow.workers.actor import PPO
from m2flow.workers.models.hf_tiny import SIZES, make_tiny_vlm
from m2flow.workers.rollout import TorchPolicy
from m2flow.workers.synthetic import SyntheticBatch

ROWS = [
    {"precision": "fp32"},
    {"precision": "bf16"},
    {"precision": "bf16", "activation_checkpointing": True},
    {"precision": "bf16", "hf": {"lora": {"r": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}}},
]


def policy(folder: Path, size: str, hf: dict | None = None) -> dict:
    image = SIZES[size]["image_size"]
    view = {"cameras": ["track"], "modalities": ["rgb"], "size": (image, image)}
    options = {"path": str(folder), "instruction": "run forward", **(hf or {})}
    return {"env_id": "HalfCheetah-v5", "model": "hf", "observation": view, "hf": options}


def measure(folder: Path, size: str, data: dict, repeats: int, device: str, row: dict) -> dict:
    cuda = device.startswith("cuda")
    options = {k: v for k, v in row.items() if k != "hf"}
    set_context(WorkerContext(worker="actor", kind="training", device=device, seed=1, iterations=100))
    trainer = PPO(
        **policy(folder, size, row.get("hf")), num_minibatches=4, update_epochs=1, normalize_reward=False, **options
    )
    params = sum(p.numel() for p in trainer.model.parameters())
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    seconds = seconds_per_update(trainer, data, repeats, cuda)
    result = {
        "precision": row["precision"],
        "options": "lora" if "hf" in row else ("activation_checkpointing" if len(options) > 1 else "-"),
        "params_m": params / 1e6,
        "trainable_m": trainable / 1e6,
        "update_s": seconds,
        "samples_per_s": data["reward"].size / seconds,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan"),
        "weights_mib": sum(t.numel() * t.element_size() for t in trainer.weights()["state"].values()) / 2**20,
    }
    del trainer
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return result


def act_latency(folder: Path, size: str, data: dict, device: str, repeats: int) -> dict:
    set_context(WorkerContext(worker="rollout", kind="inference", device=device, seed=1))
    rollout = TorchPolicy(**policy(folder, size))
    obs = {"rgb": data["obs"]["rgb"][0], "env_id": torch.arange(data["obs"]["rgb"].shape[1]).numpy()}
    rollout.act(obs)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(repeats):
        rollout.act(obs)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return {"envs": len(obs["env_id"]), "act_ms": (time.perf_counter() - began) / repeats * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="0.7b", choices=list(SIZES))
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    image = SIZES[args.size]["image_size"]
    data = SyntheticBatch(args.steps, args.envs, size=(image, image), seed=0).trajectory()
    data = {**data, "obs": {"rgb": data["obs"]["rgb"]}, "next_obs": {"rgb": data["next_obs"]["rgb"]}}
    rows = []
    with tempfile.TemporaryDirectory(prefix="m2flow-hf-") as tmp:
        folder = make_tiny_vlm(Path(tmp) / "vlm", args.size)
        for row in ROWS:
            try:
                rows.append(measure(folder, args.size, data, args.repeats, device, row))
            except Exception:  # noqa: BLE001 - a row that fails (out of memory) is reported, the others still run
                rows.append({**{k: str(v) for k, v in row.items()}, "error": traceback.format_exc(limit=3)})
            print(rows[-1], flush=True)
        latency = act_latency(folder, args.size, data, device, args.repeats)
    print("act:", latency)

    def rate(precision: str, options: str) -> float | None:
        return next(
            (r["samples_per_s"] for r in rows if r.get("precision") == precision and r.get("options") == options), None
        )

    fp32, bf16, lora = rate("fp32", "-"), rate("bf16", "-"), rate("bf16", "lora")
    params = next((r["params_m"] for r in rows if "params_m" in r), float("nan"))
    summary = f"hf policy ({params:.0f}M params, {device}): bf16/fp32 " + (
        f"{bf16 / fp32:.2f}x" if fp32 and bf16 else "-"
    )
    summary += ", lora/full (bf16) " + (f"{lora / bf16:.2f}x samples/s" if lora and bf16 else "-")
    payload = {"args": vars(args), "device": device, "rows": rows, "act": latency, "summary": summary}
    save_result("hf_policy", payload, **({"folder": args.out} if args.out else {}))
    print(summary)


if __name__ == "__main__":
    main()
