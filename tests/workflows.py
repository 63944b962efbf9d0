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


def recovery_ppo(out: Path, name: str, *, horizon: int, iterations: int, seed: int, envs: int = 2, **run) -> dict:
    """A small PPO job for the recovery tests: two simulator replicas of `envs` envs, a policy, a training
    worker (one quick update an iteration), each replica a process of its own, shared placement of one
    stage; `run` adds to the run section. A test sets replicas, classes and faults on the dict it gets."""
    raw = pendulum_ppo(
        out,
        name,
        num_envs=envs,
        hidden=[16, 16],
        horizon=horizon,
        actor={"num_minibatches": 2, "update_epochs": 1},
        run={"iterations": iterations, "seed": seed, **run},
    )
    raw["workers"]["env"]["replicas"] = 2
    raw["placement"] = {"mode": "shared", "pipeline_stages": 1, "colocate": False}
    return raw


def two_host_ppo(out: Path, address: str, *, iterations: int, checkpoint_every: int, floor_s: float) -> dict:
    """The job `tests/netns.py`'s hosts run, from host 0 through the CLI: two simulator replicas of 2 envs,
    a policy and two training ranks placed hybrid (the loop's channels and the training group span the
    hosts), restarted from its last checkpoint on a failure, on the cluster at `address`."""
    raw = pendulum_ppo(
        out,
        "hosts",
        num_envs=2,
        hidden=[16, 16],
        horizon=16,
        actor={"num_minibatches": 2, "update_epochs": 1},
        run={
            "iterations": iterations,
            "seed": 6,
            "checkpoint_every": checkpoint_every,
            "on_failure": "restart",
            "timeouts": {"floor_s": floor_s, "start_s": 60},
        },
    )
    raw["workers"]["env"]["replicas"] = 2
    raw["workers"]["actor"]["replicas"] = 2
    raw["placement"] = {"mode": "hybrid", "pipeline_stages": 1, "replan": False}
    raw["cluster"] = {"address": address}
    return raw


def simulator_across_hosts(out: Path, address: str, *, iterations: int, floor_s: float) -> dict:
    """Two simulator replicas of 2 envs pinned one to each of two hosts of 2 cores (node 0 is the driver's),
    policy and training on host 0, simulators replaced in place on a failure (`run.on_failure: replace`)."""
    raw = two_host_ppo(out, address, iterations=iterations, checkpoint_every=2, floor_s=floor_s)
    raw["run"]["on_failure"] = "replace"
    raw["workers"]["actor"]["replicas"] = 1
    raw["placement"]["devices"] = {"env": [1, 2], "rollout": 0, "actor": 0}
    return raw
