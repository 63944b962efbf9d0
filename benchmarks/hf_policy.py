"""A VLM-shaped Hugging Face policy (`model: hf`) under PPO on a camera task: samples/s and peak memory of
one update, fp32 vs bf16, full fine-tuning vs LoRA, with and without activation checkpointing (at the
rows' minibatch and at the whole batch as one minibatch, where activations weigh most), each beside the
planner's memory estimate. The batch is a real rollout: HalfCheetah's tracking camera rendered by MuJoCo
at the model's image size, the inference worker acting on it (its act() latency reported). The model is
random weights from a config (`m2flow.workers.models.hf_tiny`, size `0.7b`: ~0.7B parameters), written to
a local folder: no hub.

    python benchmarks/hf_policy.py [--size 0.7b] [--steps 4] [--envs 16] [--repeats 3]

Last line: `hf policy (<params>): bf16/fp32 <x>x, lora/full (bf16) <y>x samples/s, checkpointed/full peak at
<n> samples <z>x`.
"""

from __future__ import annotations

import argparse
import gc
import math
import tempfile
import time
import traceback
from pathlib import Path

import torch
from results_io import save_result
from update_timing import seconds_per_update

from m2flow.context import WorkerContext, set_context
from m2flow.workers.actor import PPO
from m2flow.workers.env import CameraEnv
from m2flow.workers.models.hf_tiny import SIZES, make_tiny_vlm
from m2flow.workers.rollout import TorchPolicy

LORA = {"lora": {"r": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}}
ROWS = [
    {"precision": "fp32"},
    {"precision": "bf16"},
    {"precision": "bf16", "activation_checkpointing": True},
    {"precision": "bf16", "hf": LORA},
    {"precision": "bf16", "num_minibatches": 1},
    {"precision": "bf16", "num_minibatches": 1, "activation_checkpointing": True},
]
MINIBATCHES = 4


def policy(folder: Path, size: str, hf: dict | None = None) -> dict:
    image = SIZES[size]["image_size"]
    view = {"cameras": ["track"], "modalities": ["rgb"], "size": (image, image)}
    options = {"path": str(folder), "instruction": "run forward", **(hf or {})}
    return {"env_id": "HalfCheetah-v5", "model": "hf", "observation": view, "hf": options}


def measure(folder: Path, size: str, data: dict, repeats: int, device: str, row: dict) -> dict:
    cuda = device.startswith("cuda")
    options = {"num_minibatches": MINIBATCHES} | {k: v for k, v in row.items() if k != "hf"}
    set_context(WorkerContext(worker="actor", kind="training", device=device, seed=1, iterations=100))
    args = {**policy(folder, size, row.get("hf")), "update_epochs": 1, "normalize_reward": False, **options}
    trainer = PPO(**args)
    params = sum(p.numel() for p in trainer.model.parameters())
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    seconds = seconds_per_update(trainer, data, repeats, cuda)
    samples = data["reward"].size
    result = {
        "precision": row["precision"],
        "options": "+".join(k for k in ("activation_checkpointing", "hf") if k in row).replace("hf", "lora") or "-",
        "minibatch": samples // options["num_minibatches"],
        "params_m": params / 1e6,
        "trainable_m": trainable / 1e6,
        "update_s": seconds,
        "samples_per_s": samples / seconds,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan"),
        "estimate_gib": PPO.memory_estimate_gb(PPO.Config(**args), samples),
        "weights_mib": sum(t.numel() * t.element_size() for t in trainer.weights()["state"].values()) / 2**20,
    }
    del trainer
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return result


def rollout(folder: Path, size: str, steps: int, envs: int, device: str) -> tuple[dict, dict]:
    """A real camera rollout: `envs` HalfCheetahs rendered at the model's image size, the inference worker
    acting for `steps` steps; the trajectory PPO trains on, and the loop's timings."""
    image = SIZES[size]["image_size"]
    view = {"cameras": ["track"], "modalities": ["rgb"], "size": (image, image)}
    set_context(WorkerContext(worker="env", kind="simulator", seed=1, items=(0, envs)))
    env = CameraEnv(env_id="HalfCheetah-v5", num_envs=envs, observation=view)
    set_context(WorkerContext(worker="rollout", kind="inference", device=device, seed=1))
    policy_worker = TorchPolicy(**policy(folder, size))
    obs, act_s, step_s = env.obs(), 0.0, 0.0
    for _ in range(steps):
        began = time.perf_counter()
        out = policy_worker.act(obs)  # returns numpy: the device is synchronised
        acted = time.perf_counter()
        obs = env.step(out)
        act_s, step_s = act_s + acted - began, step_s + time.perf_counter() - acted
    data = env.trajectory()
    loop = {"envs": envs, "steps": steps, "act_ms": act_s / steps * 1e3, "env_step_ms": step_s / steps * 1e3}
    return data, loop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="0.7b", choices=list(SIZES))
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    with tempfile.TemporaryDirectory(prefix="m2flow-hf-") as tmp:
        folder = make_tiny_vlm(Path(tmp) / "vlm", args.size)
        data, loop = rollout(folder, args.size, args.steps, args.envs, device)
        print("loop:", loop, flush=True)
        for row in ROWS:
            try:
                rows.append(measure(folder, args.size, data, args.repeats, device, row))
            except Exception:  # noqa: BLE001 - a row that fails (out of memory) is reported, the others still run
                rows.append({**{k: str(v) for k, v in row.items()}, "error": traceback.format_exc(limit=3)})
            print(rows[-1], flush=True)

    def row_of(precision: str, options: str, minibatch: int) -> dict:
        key = (precision, options, minibatch)
        return next((r for r in rows if (r.get("precision"), r.get("options"), r.get("minibatch")) == key), {})

    small, whole = data["reward"].size // MINIBATCHES, data["reward"].size
    fp32, bf16 = row_of("fp32", "-", small).get("samples_per_s"), row_of("bf16", "-", small).get("samples_per_s")
    lora = row_of("bf16", "lora", small).get("samples_per_s")
    full = row_of("bf16", "-", whole).get("peak_gib", math.nan)
    checkpointed = row_of("bf16", "activation_checkpointing", whole).get("peak_gib", math.nan)
    params = next((r["params_m"] for r in rows if "params_m" in r), float("nan"))
    summary = f"hf policy ({params:.0f}M params, {device}): bf16/fp32 " + (
        f"{bf16 / fp32:.2f}x" if fp32 and bf16 else "-"
    )
    summary += ", lora/full (bf16) " + (f"{lora / bf16:.2f}x samples/s" if lora and bf16 else "-")
    summary += f", checkpointed/full peak at {whole} samples " + (
        "-" if math.isnan(full / checkpointed) else f"{checkpointed / full:.2f}x"
    )
    payload = {"args": vars(args), "device": device, "rows": rows, "loop": loop, "summary": summary}
    save_result("hf_policy", payload, **({"folder": args.out} if args.out else {}))
    print(summary)


if __name__ == "__main__":
    main()
