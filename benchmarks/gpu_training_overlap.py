"""Can a training update share one GPU with acting without slowing it? The 100M ViT's act call (bf16, the S=2
slice of 192 envs) beside a PPO-shaped update of another copy of it (a minibatch of 2,048, bf16 autocast,
AdamW, gradient clipping, one host read a step), on one GPU, five ways:

- `alone`: each by itself;
- `processes`: the update in a process of its own, as m2flow runs a training worker beside an inference worker on
  one GPU today: the driver time-slices the two processes' CUDA contexts;
- `threads`: the update in a thread of the acting process, on the default stream, acting on a stream of its own
  at the same priority: one context, so the kernels of both may run at once;
- `priority`: the update in a thread on a stream of its own at the lowest priority, acting's at the highest the
  device offers, so the GPU's block scheduler serves acting's kernels first (two changes from `threads`: the
  update's stream and the priorities);
- `priority_short_switch`: as `priority`, the interpreter switching threads every 0.5 ms (not 5 ms), to tell a
  wait on the GIL from a wait on the GPU.

Per variant: the act latency (median ms) and the update's steps/s, each against alone. One-step-off PPO on one
GPU overlaps the two (RESULTS.md: acting 1.22-2.10x and the update 1.70-2.02x slower than alone); this measures
whether hosting them in one process at two priorities would keep acting near its own speed.

    python benchmarks/gpu_training_overlap.py [--seconds 6] [--minibatch 2048] [--out benchmarks/results]

Ends with `training beside acting: act X.XXx alone in processes, Y.YYx alone in threads, ...; update ...`.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from gpu_contention import POLICY, VIEW, act_call, latency_ms
from results_io import save_result

ACT_BATCH = 96  # the S=2 slice of configs/ppo_camera_gpu.yaml's 192 envs
WARM_UP_STEPS = 3
START_S = 120.0  # for the update loop to build its model and take its warm-up steps
STOP_S = 60.0  # for the update loop to end its step once told to stop
VARIANTS = ("processes", "threads", "priority", "priority_short_switch")
SHORT_SWITCH_S = 0.0005  # the interpreter's GIL switch interval in `priority_short_switch` (Python's default: 5 ms)


def update_step(minibatch: int) -> Callable[[], None]:
    """One PPO-shaped update step of a fresh copy of the policy on a fixed minibatch of camera observations."""
    import torch

    torch.manual_seed(1)
    model = _policy().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    h, w = VIEW["size"]
    obs = {
        "rgb": torch.randint(0, 255, (minibatch, 1, h, w, 3), dtype=torch.uint8, device="cuda"),
        "proprio": torch.zeros(minibatch, 17, device="cuda"),
    }
    actions = torch.randn(minibatch, model.act_dim, device="cuda")
    advantages = torch.randn(minibatch, device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, logprob, entropy, value = model.get_action_and_value(obs, action=actions)
            loss = -(logprob * advantages).mean() + 0.5 * value.pow(2).mean() - 0.01 * entropy.mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()
        loss.item()  # the trainer's statistics: a host read a step

    return step


def _policy():
    from m2flow.workers.rollout.torch_policy import TorchPolicyConfig

    return TorchPolicyConfig(**POLICY, observation=VIEW).build().cuda()


class StepCounter:
    """Update steps taken so far, by a loop in another thread or process, read as a rate over a window."""

    def __init__(self, value):
        self.value = value
        self.began, self.at_start = 0.0, 0

    def start(self) -> None:
        self.began, self.at_start = time.monotonic(), self.value.value

    def per_s(self) -> float:
        return (self.value.value - self.at_start) / (time.monotonic() - self.began)


def train_until(minibatch: int, steps, ready, stop, priority: int | None) -> None:
    """Take update steps until `stop`, counting them in `steps`; on a stream of `priority` where given."""
    import torch

    stream = torch.cuda.Stream(priority=priority) if priority is not None else torch.cuda.current_stream()
    with torch.cuda.stream(stream):
        step = update_step(minibatch)
        for _ in range(WARM_UP_STEPS):
            step()
        ready.set()
        while not stop.is_set():
            step()
            with steps.get_lock():
                steps.value += 1


def rate_alone(minibatch: int, seconds: float) -> float:
    step = update_step(minibatch)
    for _ in range(WARM_UP_STEPS):
        step()
    taken, began = 0, time.monotonic()
    while time.monotonic() - began < seconds:
        step()
        taken += 1
    return taken / (time.monotonic() - began)


def beside(variant: str, act: Callable[[], None], args: argparse.Namespace) -> dict:
    """The act latency and the update's steps/s while an update loop runs as `variant` says."""
    import torch

    if variant == "processes":
        context = mp.get_context("spawn")
        steps, ready, stop = context.Value("l", 0), context.Event(), context.Event()
        worker = context.Process(target=train_until, args=(args.minibatch, steps, ready, stop, None), daemon=True)
    else:
        steps, ready, stop = mp.Value("l", 0), threading.Event(), threading.Event()
        low = 0 if variant.startswith("priority") else None  # 0: the lowest priority torch's streams take
        worker = threading.Thread(target=train_until, args=(args.minibatch, steps, ready, stop, low), daemon=True)
    act_stream = torch.cuda.Stream(priority=-100 if variant.startswith("priority") else 0)  # clamped to the highest
    switch = sys.getswitchinterval()
    if variant == "priority_short_switch":
        sys.setswitchinterval(SHORT_SWITCH_S)

    def act_on_stream() -> None:
        with torch.cuda.stream(act_stream):
            act()

    worker.start()
    try:
        started_by = time.monotonic() + START_S
        while not ready.wait(timeout=1.0):
            if not worker.is_alive():
                raise RuntimeError(f"{variant}: the update loop ended before it started (its error is above)")
            if time.monotonic() > started_by:
                raise TimeoutError(f"{variant}: the update loop did not start within {START_S:g} s")
        counter = StepCounter(steps)
        counter.start()
        act_ms = latency_ms(act_on_stream, args.seconds)
        update_per_s = counter.per_s()
        if not worker.is_alive():
            raise RuntimeError(f"{variant}: the update loop ended while acting was measured (its error is above)")
    finally:
        sys.setswitchinterval(switch)
        stop.set()
        worker.join(timeout=STOP_S)
        if variant == "processes" and worker.is_alive():
            worker.kill()
            worker.join(timeout=STOP_S)
    if worker.is_alive():  # a thread cannot be killed: it would run beside the next variant
        raise TimeoutError(f"{variant}: the update loop did not stop within {STOP_S:g} s of being told to")
    return {"variant": variant, "act_ms": act_ms, "update_per_s": update_per_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--minibatch", type=int, default=2048)
    parser.add_argument("--name", default="gpu_training_overlap")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    import torch

    act = act_call(ACT_BATCH, graph=False)
    alone = {"act_ms": latency_ms(act, args.seconds), "update_per_s": rate_alone(args.minibatch, args.seconds)}
    torch.cuda.empty_cache()  # the update's memory back to the device, for the update in another process
    print(f"alone     act {alone['act_ms']:7.2f} ms; update {alone['update_per_s']:6.2f} steps/s", flush=True)
    rows = []
    for variant in VARIANTS:
        row = beside(variant, act, args)
        row["act_vs_alone"] = row["act_ms"] / alone["act_ms"]
        row["update_vs_alone"] = row["update_per_s"] / alone["update_per_s"]
        rows.append(row)
        print(
            f"{variant:9s} act {row['act_ms']:7.2f} ms ({row['act_vs_alone']:.2f}x alone);"
            f" update {row['update_per_s']:6.2f} steps/s ({row['update_vs_alone']:.2f}x alone)",
            flush=True,
        )
    save_result(args.name, {"args": vars(args), "act_batch": ACT_BATCH, "alone": alone, "rows": rows}, Path(args.out))
    by = {r["variant"]: r for r in rows}
    print(
        "training beside acting: act "
        + ", ".join(f"{by[v]['act_vs_alone']:.2f}x alone in {v}" for v in VARIANTS)
        + "; update "
        + ", ".join(f"{by[v]['update_vs_alone']:.2f}x" for v in VARIANTS)
    )


if __name__ == "__main__":
    main()
