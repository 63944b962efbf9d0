"""Small real workers used by the tests (importable by Ray actors through their dotted paths)."""

from __future__ import annotations

import ctypes
import os
import signal
import time
from pathlib import Path
from typing import Literal

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.pendulum import PendulumEnv
from gymnasium.envs.mujoco.inverted_pendulum_v5 import InvertedPendulumEnv
from pydantic import Field

import m2flow
from m2flow.sharding import shard_groups
from m2flow.workers.actor import PPO, PPOConfig
from m2flow.workers.env.gym_env import GymEnv, GymEnvConfig
from m2flow.workers.rollout import TorchPolicy
from m2flow.workers.rollout.torch_policy import TorchPolicyConfig
from m2flow.workers.synthetic import env_block


class CounterConfig(m2flow.WorkerConfig):
    items_field = "num_envs"

    num_envs: int = Field(2, ge=1)


class Counter:
    """A simulator whose state is a counter per env; step adds the action."""

    Config = CounterConfig

    def __init__(self, num_envs: int = 2):
        ctx = m2flow.context()
        self.ids = np.arange(*ctx.items)
        self.state = self.ids.astype(np.float64) * 100
        self.seen: list[np.ndarray] = []

    def obs(self) -> np.ndarray:
        return self.state.copy()

    def step(self, action: np.ndarray) -> np.ndarray:
        self.state = self.state + action
        self.seen.append(self.state.copy())
        return self.state.copy()

    def trajectory(self) -> dict:
        out = {"states": np.stack(self.seen, axis=1), "ids": self.ids}
        self.seen = []
        return out


class RenderingCounter(Counter):
    """A Counter whose observations are camera images: its `obs` and `step` render (on the node's GPU, if any)."""

    rendering_ports = frozenset({"obs", "step"})


class CheckpointedCounter(Counter):
    """A Counter whose counters are checkpointed, with no way to cut them into other slices."""

    def state_dict(self) -> dict:
        return {"state": self.state.copy()}

    def load_state_dict(self, state: dict) -> None:
        self.state = np.array(state["state"])


class PlusOne:
    batch_invariant = frozenset({"act"})  # ones, whatever rows share a call

    def __init__(self):
        self.swaps = {"offload": 0, "onload": 0}

    def act(self, obs: np.ndarray) -> np.ndarray:
        return np.ones_like(obs)

    def offload(self) -> None:
        self.swaps["offload"] += 1

    def onload(self) -> None:
        self.swaps["onload"] += 1

    def metrics(self) -> dict:
        return {f"policy/{op}s": float(n) for op, n in self.swaps.items()}


class PlusOnePerSlice(PlusOne):
    """PlusOne declaring no port batch-invariant: the loop calls its `act` slice by slice."""

    batch_invariant = frozenset()


class Collect:
    def train(self, trajectories: list[dict]) -> dict:
        ids = np.concatenate([t["ids"] for t in trajectories])
        states = np.concatenate([t["states"] for t in trajectories])
        return {
            "envs": float(len(ids)),
            "final_sum": float(states[:, -1].sum()),
            "ordered": float(np.all(np.diff(ids) > 0)),
        }


class SlowCollectConfig(m2flow.WorkerConfig):
    seconds: float = Field(0.5, ge=0)


class SlowCollect(Collect):
    """Trains for `seconds`, far longer than a short loop runs: drop mode has batches to drop."""

    Config = SlowCollectConfig

    def __init__(self, seconds: float = 0.5):
        self.seconds = seconds

    def train(self, trajectories: list[dict]) -> dict:
        time.sleep(self.seconds)
        return super().train(trajectories)


class MisdeclaredDispatch(Collect):
    """Declares dispatch rules for a port it lacks, and a string where a rule belongs."""

    port_dispatch = {"nope": m2flow.Dispatch(), "train": "shard"}


class CollectParts(Collect):
    """Takes parts early: its then-edge from the loop streams."""

    def train_part(self, trajectories: list[dict]) -> None:
        pass


class FailsToStart:
    def __init__(self):
        raise RuntimeError("cannot open the simulator, on purpose")

    def act(self, obs: np.ndarray) -> np.ndarray:
        return obs


class Crashing:
    def act(self, obs: np.ndarray) -> np.ndarray:
        raise ValueError("policy exploded on purpose")


class Hanging:
    def act(self, obs: np.ndarray) -> np.ndarray:
        time.sleep(3600)
        return obs


class FixedBatch:
    """A fixed, seeded PPO batch shaped like HalfCheetah's (17-dim obs, 6-dim actions); with several
    replicas each sends its contiguous block of the envs."""

    def __init__(self, steps: int = 32, envs: int = 4, seed: int = 0):
        self.steps, self.envs, self.seed = steps, envs, seed
        ctx = m2flow.context()
        self.block = shard_groups(envs, ctx.replicas)[ctx.replica]

    def trajectory(self) -> dict:
        rng = np.random.default_rng(self.seed)
        t, n = self.steps, self.envs
        f32 = np.float32
        whole = {
            "obs": rng.normal(size=(t, n, 17)).astype(f32),
            "action": rng.normal(size=(t, n, 6)).astype(f32),
            "logprob": rng.normal(-8, 0.5, size=(t, n)).astype(f32),
            "value": rng.normal(size=(t, n)).astype(f32),
            "reward": rng.normal(size=(t, n)).astype(f32),
            "done": (rng.random((t, n)) < 0.05).astype(f32),
            "next_obs": rng.normal(size=(n, 17)).astype(f32),
            "next_done": np.zeros(n, f32),
        }
        return env_block(whole, self.block)


class SaveBatch:
    """Writes every trajectory it receives (merged along the env axis) under the run folder."""

    def __init__(self):
        self.dir = m2flow.context().output_dir
        self.calls = 0

    def train(self, trajectories: list[dict]) -> dict:
        merged = {
            k: np.concatenate([t[k] for t in trajectories], axis=1 if k in ("obs", "reward", "action") else 0)
            for k in ("obs", "reward", "action", "env_ids")
        }
        np.savez(f"{self.dir}/batch_{self.calls}.npz", **merged)
        self.calls += 1
        return {"saved": float(self.calls)}

    def state_dict(self) -> dict:
        return {"calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.calls = state["calls"]


class DropsOne(Collect):
    """A consumer that loses one step per iteration and says so: the accounting check must catch it."""

    def train(self, trajectories: list[dict]) -> dict:
        steps = sum(t["states"].size for t in trajectories)
        return {**super().train(trajectories), "learner/steps_consumed": float(steps - 1)}


class SavingPolicy(TorchPolicy):
    """An inference worker that also writes the batches sent to its `train` (a two-worker workflow:
    env + this, so even `disaggregated` fits on two devices)."""

    def __init__(self, **policy):
        super().__init__(**policy)
        self.saver = SaveBatch()

    def train(self, trajectories: list[dict]) -> dict:
        return self.saver.train(trajectories)

    def state_dict(self) -> dict:
        return {**super().state_dict(), **self.saver.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.saver.calls = state["calls"]


class SlowSavingPolicy(SavingPolicy):
    """A SavingPolicy whose act also waits 20 ms, as a call paid per call does: the slices the simulators send
    meanwhile arrive before it acts on the next."""

    def act(self, batch):
        time.sleep(0.02)
        return super().act(batch)


class WholeBatchPPO(PPO):
    """PPO that takes no parts: its then-edge waits for the whole loop (the reference for streaming)."""

    train_part = None


class Fault(m2flow.WorkerConfig):
    """Where a faulty worker's `fault_replica` kills (SIGKILL: a crash) or stops (SIGSTOP: a hang) its own
    process, once: at a given step of the run, or in the first `metrics()` call after it (between loops,
    while nothing waits on it), in the first weight sync after it (a policy's `load_weights`, a training
    worker's `weights`), as the simulator hands over its first trajectory after it, or as its state is
    gathered for the first checkpoint after it (`state_dict()`)."""

    fault: Literal["kill", "stop"] = "kill"
    fault_replica: int = 0
    fault_at_step: int = Field(10, ge=1, description="the replica's step (counted over the run) it strikes at")
    fault_in: Literal["step", "metrics", "sync", "handover", "checkpoint"] = Field(
        "step",
        description="in the loop, or outside it the first time after the step: metrics(), sync, handover, checkpoint",
    )
    marker: str = Field(description="a file the fault writes its time to: it strikes once, not in the replacement")
    armed_by: str | None = Field(
        None, description="a file it waits for (at most a minute, its loop stalled) before it strikes at its step"
    )

    @classmethod
    def split(cls, args: dict, base: type[m2flow.WorkerConfig]) -> tuple[Fault, dict]:
        """A faulty worker's args as its fault and the args of the worker it wraps (`base` its config)."""
        return cls(**{k: v for k, v in args.items() if k in cls.model_fields}), {
            k: v for k, v in args.items() if k in base.model_fields
        }

    def stepped(self, steps: int) -> None:
        if self.fault_in == "step" and steps == self.fault_at_step:
            self._strike()

    def outside_loop(self, where: Literal["metrics", "sync", "handover", "checkpoint"], steps: int) -> None:
        if self.fault_in == where and steps >= self.fault_at_step:
            self._strike()

    def _strike(self) -> None:
        marker = Path(self.marker)
        if m2flow.context().replica == self.fault_replica and not marker.exists():
            waited_until = time.monotonic() + 60
            while self.armed_by is not None and not Path(self.armed_by).exists() and time.monotonic() < waited_until:
                time.sleep(0.05)
            marker.write_text(f"{time.time()}\n")
            os.kill(os.getpid(), signal.SIGKILL if self.fault == "kill" else signal.SIGSTOP)


class FaultyGymEnvConfig(GymEnvConfig, Fault):
    pass


class FaultyGymEnv(GymEnv):
    """A GymEnv that strikes as its `Fault` says, counting its `step` calls."""

    Config = FaultyGymEnvConfig

    def __init__(self, **args):
        self.fault, own = Fault.split(args, GymEnvConfig)
        super().__init__(**own)
        self.steps = 0

    def step(self, policy_out):
        self.steps += 1
        self.fault.stepped(self.steps)
        return super().step(policy_out)

    def metrics(self):
        self.fault.outside_loop("metrics", self.steps)
        return super().metrics()

    def trajectory(self):
        self.fault.outside_loop("handover", self.steps)
        return super().trajectory()

    def state_dict(self):
        self.fault.outside_loop("checkpoint", self.steps)
        return super().state_dict()


class FaultyPolicyConfig(TorchPolicyConfig, Fault):
    pass


class FaultyPolicy(TorchPolicy):
    """A TorchPolicy that strikes as its `Fault` says, counting its `act` calls."""

    Config = FaultyPolicyConfig

    def __init__(self, **args):
        self.fault, own = Fault.split(args, TorchPolicyConfig)
        super().__init__(**own)
        self.steps = 0

    def act(self, batch):
        self.steps += 1
        self.fault.stepped(self.steps)
        return super().act(batch)

    def metrics(self):
        self.fault.outside_loop("metrics", self.steps)
        return {}

    def load_weights(self, weights):
        self.fault.outside_loop("sync", self.steps)
        return super().load_weights(weights)

    def state_dict(self):
        self.fault.outside_loop("checkpoint", self.steps)
        return super().state_dict()


class BadStarts:
    """A gymnasium env whose reset fails for the seeds in `bad_seeds` (every seed with `bad_seeds="all"`), as a
    simulator does whose sampled initial state is infeasible: it raises, or (`crash="segfault"`) crashes its
    process as a physics engine's C code does, reading address 0."""

    def __init__(
        self, bad_seeds: list[int] | Literal["all"] = (), crash: Literal["raise", "segfault"] = "raise", **kwargs
    ):
        super().__init__(**kwargs)
        self.bad_seeds, self.crash = bad_seeds, crash

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None and (self.bad_seeds == "all" or seed in self.bad_seeds):
            if self.crash == "segfault":
                ctypes.string_at(0)
            raise RuntimeError(f"infeasible initial state from seed {seed}")
        return super().reset(seed=seed, options=options)


class InvertedPendulumBadStarts(BadStarts, InvertedPendulumEnv):
    """A MuJoCo env: a checkpoint holds its simulator state."""


class PendulumBadStarts(BadStarts, PendulumEnv):
    """Not a MuJoCo env: a run resumed from a checkpoint starts its episodes from their seeds again."""


gym.register(
    "InvertedPendulumBadStarts-v0", entry_point=InvertedPendulumBadStarts, max_episode_steps=1000, reward_threshold=950
)
gym.register("PendulumBadStarts-v0", entry_point=PendulumBadStarts, max_episode_steps=200)


class FaultyPPOConfig(PPOConfig, Fault):
    pass


class FaultyPPO(PPO):
    """PPO that strikes as its `Fault` says, counting its `train` calls (over the process's life): a rank
    stopped as a train call begins leaves the other ranks waiting for it in the update's first collective;
    one struck in the sync dies as it gathers the weights it is to send."""

    Config = FaultyPPOConfig

    def __init__(self, **args):
        self.fault, own = Fault.split(args, PPOConfig)
        super().__init__(**own)
        self.trains = 0

    def train(self, trajectories):
        self.trains += 1
        self.fault.stepped(self.trains)
        return super().train(trajectories)

    def weights(self):
        self.fault.outside_loop("sync", self.trains)
        return super().weights()


class GrabsGpuMemory:
    """Allocates what it is asked for on the GPU (memory shares' test)."""

    def grab(self, gb: float) -> int:
        import torch

        return torch.empty(int(gb * 2**30), dtype=torch.uint8, device="cuda").numel()


class CoresCollect(Collect):
    """Collect, reporting the cores its process may run on and torch's intra-op threads (`resources.threads`)."""

    def train(self, trajectories: list[dict]) -> dict:
        import torch

        return {
            **super().train(trajectories),
            "cores": float(len(os.sched_getaffinity(0))),
            "torch_threads": float(torch.get_num_threads()),
        }
