"""Workflows the integration tests share, as raw dicts a test adjusts before `spec_from_dict`."""

from __future__ import annotations

from pathlib import Path


def pendulum_ppo(
    out: Path,
    name: str,
    *,
    num_envs: int = 4,
    hidden: list[int] | None = None,
    horizon: int = 64,
    actor: dict | None = None,
    run: dict | None = None,
) -> dict:
    """PPO on InvertedPendulum: a GymEnv -> TorchPolicy loop, then training, then weight sync."""
    env = {"env_id": "InvertedPendulum-v5"}
    policy = {**env, "hidden": hidden} if hidden else env
    return {
        "name": name,
        "workers": {
            "env": {"kind": "simulator", "class": "m2flow.workers.env.GymEnv", "args": {**env, "num_envs": num_envs}},
            "rollout": {"kind": "inference", "class": "m2flow.workers.rollout.TorchPolicy", "args": policy},
            "actor": {"kind": "training", "class": "m2flow.workers.actor.PPO", "args": {**policy, **(actor or {})}},
        },
        "flow": {
            "loop": {"horizon": horizon, "edges": ["env.obs -> rollout.act", "rollout.act -> env.step"]},
            "then": ["env.trajectory -> actor.train"],
            "sync": [{"edge": "actor.weights -> rollout.load_weights"}],
        },
        "run": {"output_dir": str(out), "progress": False, **(run or {})},
    }
