"""The seed-style API: two plain functions closed into an interaction loop, run in hybrid mode."""

import numpy as np

import m2flow as mf


def run_physics_sim(actions=None):
    """A toy simulator: the state drifts by the action; returns the observation."""
    run_physics_sim.state = getattr(run_physics_sim, "state", np.zeros(4)) + (0 if actions is None else actions)
    return run_physics_sim.state.copy()


def run_llm_inference(observation):
    """A toy policy: push the state back towards zero."""
    return -0.5 * observation + 0.1


if __name__ == "__main__":
    mf.define_worker(name="simulator", func=run_physics_sim, kind="simulator")
    mf.define_worker(name="inference", func=run_llm_inference, kind="inference")
    result = mf.run(workers=["simulator", "inference"], mode="hybrid", iterations=2, horizon=8, output_dir="runs")
    print(f"ran {result.iterations} iterations in {result.plan.mode} mode; outputs in {result.run_dir}")
