"""How a core's physics slows as more simulator processes step at once on one machine: HalfCheetah-v5 stepped
in P processes together, each pinned to a core of its own (cores 0..P-1, as m2flow pins simulator replicas),
for P in `--processes`. A lent GPU machine's 16 "cores" may be 8 physical ones with two hardware threads each;
the core topology is recorded beside the timings.

    python benchmarks/physics_scaling.py [--processes 1 4 8 12 16] [--steps 3000]

Last line: `physics scaling: <P> processes at once <r>x a step of 1 alone` (P the most processes run).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time
from pathlib import Path

from results_io import save_result


def step_alone(core: int, steps: int, start: mp.Barrier, out: mp.Queue) -> None:
    """Step one HalfCheetah `steps` times on `core` once every process is ready; put its µs per step."""
    import gymnasium as gym
    import numpy as np

    os.sched_setaffinity(0, {core})
    env = gym.make("HalfCheetah-v5")
    env.reset(seed=core)
    action = np.zeros(env.action_space.shape, np.float32)
    for _ in range(200):  # warm up
        env.step(action)
    start.wait()
    began = time.perf_counter()
    for _ in range(steps):
        env.step(action)
    out.put((core, 1e6 * (time.perf_counter() - began) / steps))


def together(processes: int, steps: int) -> list[float]:
    """Each of `processes` processes' µs per step, stepping at once."""
    start, out = mp.Barrier(processes), mp.Queue()
    workers = [mp.Process(target=step_alone, args=(core, steps, start, out)) for core in range(processes)]
    for worker in workers:
        worker.start()
    results = [out.get(timeout=300) for _ in workers]
    for worker in workers:
        worker.join(timeout=30)
    return [us for _, us in sorted(results)]


def topology() -> dict[str, str]:
    """Each core's hardware-thread siblings, as the kernel lists them."""
    cpus = Path("/sys/devices/system/cpu")
    siblings = {}
    for core in range(os.cpu_count() or 1):
        path = cpus / f"cpu{core}" / "topology" / "thread_siblings_list"
        siblings[str(core)] = path.read_text().strip() if path.exists() else "unknown"
    return siblings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 4, 8, 12, 16])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--name", default="physics_scaling")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    rows = []
    for processes in (p for p in args.processes if p <= cores):
        per_process = together(processes, args.steps)
        rows.append({"processes": processes, "us_per_step": per_process, "median_us": statistics.median(per_process)})
        print(f"{processes:3d} processes: {rows[-1]['median_us']:7.1f} us a step (the processes' median)", flush=True)
    save_result(args.name, {"args": vars(args), "siblings": topology(), "rows": rows}, args.out)
    alone, most = rows[0], rows[-1]
    print(
        f"physics scaling: {most['processes']} processes at once {most['median_us'] / alone['median_us']:.2f}x"
        f" a step of {alone['processes']} alone"
    )


if __name__ == "__main__":
    main()
