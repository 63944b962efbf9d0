"""What a simulator's observation normaliser adds to a physics step: HalfCheetah-v5 stepped bare, with gymnasium's
`NormalizeObservation` and a clip wrapper (what m2flow's simulators used before), and with m2flow's
`ClippedNormalization` (the same statistics, bit-identical), in rounds alternating the order, one process.

    python benchmarks/step_cost.py [--steps 5000] [--rounds 3]

Last line: `step cost: gymnasium's normaliser <a>x a bare step, m2flow's <b>x; m2flow's <c>x cheaper a step`.
"""

from __future__ import annotations

import argparse
import statistics
import time

import gymnasium as gym
import numpy as np
from results_io import save_result

from m2flow.workers.env.normalization import ClippedNormalization

CLIP = 10.0


def gymnasium_normalised(env: gym.Env) -> gym.Env:
    env = gym.wrappers.NormalizeObservation(env)
    return gym.wrappers.TransformObservation(env, lambda o: np.clip(o, -CLIP, CLIP), env.observation_space)


VARIANTS = {
    "bare": lambda env: env,
    "gymnasium": gymnasium_normalised,
    "m2flow": lambda env: ClippedNormalization(env, CLIP),
}


def us_per_step(wrap, steps: int) -> float:
    env = wrap(gym.make("HalfCheetah-v5"))
    env.reset(seed=0)
    action = np.zeros(env.action_space.shape, np.float32)
    for _ in range(300):  # warm up
        env.step(action)
    began = time.perf_counter()
    for _ in range(steps):
        env.step(action)
    return 1e6 * (time.perf_counter() - began) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    rows = []
    for round_ in range(args.rounds):
        order = list(VARIANTS) if round_ % 2 == 0 else list(reversed(VARIANTS))
        for variant in order:
            cost = us_per_step(VARIANTS[variant], args.steps)
            rows.append({"round": round_, "variant": variant, "us_per_step": cost})
            print(f"round {round_} {variant:10s} {rows[-1]['us_per_step']:7.1f} us a step", flush=True)
    median = {v: statistics.median(r["us_per_step"] for r in rows if r["variant"] == v) for v in VARIANTS}
    save_result("step_cost", {"args": vars(args), "rows": rows, "median_us": median}, args.out)
    print(
        f"step cost: gymnasium's normaliser {median['gymnasium'] / median['bare']:.2f}x a bare step, m2flow's"
        f" {median['m2flow'] / median['bare']:.2f}x; m2flow's {median['gymnasium'] / median['m2flow']:.2f}x cheaper"
        " a step"
    )


if __name__ == "__main__":
    main()
