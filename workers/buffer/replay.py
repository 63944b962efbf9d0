"""A replay buffer worker: transitions from the simulators' trajectories in, minibatches for off-policy
training out.

Ports: `add(trajectories)` takes the time-major trajectories simulator workers send (`GymEnv.trajectory()`:
obs [T, envs, ...], action, reward, done = "this step began an episode", truncated / final_obs for episodes
a time limit cut, next_obs / next_done after the last step) and stores one transition (s, a, r, s', terminal)
per env step; `sample()` returns the minibatches the training worker's updates of this iteration read:
`updates_per_step` x the env steps added since the last call (fractions carried over), each `batch_size`
transitions, drawn uniformly
or in proportion to priorities (prioritised replay, Schaul et al. 2016, with its importance weights, left
unnormalised: the training worker divides them by their maximum over the whole sample);
`update_priorities(...)` takes the training worker's new priorities for the transitions it sampled.

The buffer is a ring of fixed capacity; its contents, write position and random stream are checkpointed
(`save_checkpoint` writes one .npz), so a resumed run samples exactly what the uninterrupted run would.

Sharded: with R replicas each holds a shard, 1/R of the capacity. Replica r adds the r-th contiguous block of
the simulators' trajectories (`add` splits by shard) and draws its share of every minibatch, so the
training worker's minibatch is the R shares side by side; `index` is global (shard r's rows start at
r x its capacity) and every replica hears every priority update, keeping its own. Prioritised sampling is
then per shard: a shard draws its share in proportion to its own priorities. The shards must receive
equal numbers of env steps (give each buffer replica as many simulator replicas: `add` is an `even` shard
split, refused otherwise as the workflow is validated), or their minibatch counts would differ; `batch_size`
must split evenly over them. `buffer/size` is the total held (a shard's size times the shards).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

import m2flow
from m2flow.durable import write_durably
from m2flow.errors import WorkerError

SEPARATOR = "."  # a camera observation's modality is stored as its own field: "obs.rgb"


class ReplayBufferConfig(m2flow.WorkerConfig):
    capacity: int = Field(1_000_000, ge=1, description="transitions kept; the oldest are overwritten")
    batch_size: int = Field(256, ge=1, description="transitions per minibatch")
    updates_per_step: float = Field(1.0, gt=0, description="minibatches sampled per env step added (the UTD ratio)")
    learning_starts: int = Field(5_000, ge=0, description="transitions held before the first minibatch")
    sampling: Literal["uniform", "prioritized"] = Field("uniform", description="how transitions are drawn")
    alpha: float = Field(0.6, ge=0, description="prioritized: priority exponent")
    beta: float = Field(0.4, ge=0, le=1, description="prioritized: importance-weight exponent")


class ReplayBuffer:
    Config = ReplayBufferConfig
    port_dispatch = {
        "add": m2flow.Dispatch(split="shard", even=True),
        "update_priorities": m2flow.Dispatch(split="broadcast"),
    }

    @staticmethod
    def data_parallel_size(cfg: ReplayBufferConfig, replicas: int, backend: str | None) -> int:
        """Every replica holds a shard of its own and draws an equal share of every minibatch: `batch_size` must
        split evenly over them (refused otherwise as the workflow is validated)."""
        if cfg.batch_size % replicas:
            raise ValueError(
                f"args.batch_size: {cfg.batch_size} does not split evenly over {replicas} buffer shards (each draws"
                f" an equal share of every minibatch); use a multiple of {replicas}"
            )
        return replicas

    def __init__(self, **args: Any):
        self.cfg = ReplayBufferConfig(**args)
        ctx = m2flow.context()
        self.rng = np.random.default_rng([ctx.seed, 4711, ctx.replica])
        self.storage: dict[str, np.ndarray] = {}
        self.shard, self.shards = ctx.replica, ctx.replicas
        self.capacity = -(-self.cfg.capacity // ctx.replicas)  # this shard's
        self.batch_size = self.cfg.batch_size // ctx.replicas  # its share of a minibatch
        self.learning_starts = -(-self.cfg.learning_starts // ctx.replicas)
        self.size = 0  # transitions held
        self.position = 0  # the next write
        self.owed = 0.0  # minibatches the env steps added so far call for, not yet sampled
        self.priorities = np.zeros(self.capacity, dtype=np.float64)
        self.max_priority = 1.0

    @staticmethod
    def memory_estimate_gb(config: ReplayBufferConfig, samples: int) -> float:
        return 0.0  # host memory only, allocated on the first add

    def add(self, trajectories: list[dict[str, Any]]) -> dict[str, float]:
        added = 0
        for trajectory in trajectories:
            batch = _flat_fields(transitions(trajectory))
            self._store(batch)
            added += len(batch["reward"])
        return {"buffer/size": float(self.size * self.shards), "buffer/steps_consumed": float(added)}

    def sample(self) -> dict[str, np.ndarray]:
        """This iteration's minibatches, [updates, batch_size, ...] per field (plus `index` and, for
        prioritised replay, `weight`); none (`updates` 0) until `learning_starts` transitions are held."""
        if not self.storage:
            raise WorkerError(
                "ReplayBuffer.sample ran before any add: name `... -> buffer.add` before `buffer.sample -> ...` in"
                " flow.then (ports of one worker run in the order the edges first name them)"
            )
        updates = int(self.owed) if self.size >= self.learning_starts else 0
        self.owed = self.owed - updates if updates else 0.0  # before learning_starts nothing is owed
        shape = (updates, self.batch_size)
        if self.cfg.sampling == "prioritized" and updates:
            scaled = self.priorities[: self.size] ** self.cfg.alpha
            p = scaled / scaled.sum()
            index = self.rng.choice(self.size, size=shape, p=p)
            weight = (self.size * p[index]) ** -self.cfg.beta  # unnormalised: the consumer divides by the max
            batch = {"weight": weight.astype(np.float32)}
        else:
            index = self.rng.integers(0, max(self.size, 1), size=shape)
            batch = {}
        batch.update({name: stored[index] for name, stored in self.storage.items()})
        batch["index"] = index + self.shard * self.capacity
        return _nested_fields(batch)

    def update_priorities(self, updates: list[dict[str, np.ndarray]]) -> None:
        """New priorities (|TD error|) for the transitions a training worker sampled: `{index, priority}`."""
        for update in updates:
            if update and self.cfg.sampling == "prioritized":
                index = np.asarray(update["index"]).reshape(-1) - self.shard * self.capacity
                mine = (index >= 0) & (index < self.capacity)  # this shard's transitions
                priority = np.asarray(update["priority"], dtype=np.float64).reshape(-1)[mine] + 1e-6
                self.priorities[index[mine]] = priority
                self.max_priority = max(self.max_priority, float(priority.max(initial=0.0)))

    def _store(self, batch: dict[str, np.ndarray]) -> None:
        n = len(batch["reward"])
        if not self.storage:
            self.storage = {
                name: np.zeros((self.capacity, *value.shape[1:]), dtype=value.dtype) for name, value in batch.items()
            }
        rows = (self.position + np.arange(n)) % self.capacity
        for name, value in batch.items():
            self.storage[name][rows] = value
        self.priorities[rows] = self.max_priority
        self.position = int((self.position + n) % self.capacity)
        self.size = min(self.size + n, self.capacity)
        self.owed += n * self.cfg.updates_per_step * self.shards  # its n steps are 1/shards of the env's

    def save_checkpoint(self, path: str) -> None:
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        scalars = np.array([self.size, self.position, self.capacity], dtype=np.int64)
        floats = np.array([self.owed, self.max_priority], dtype=np.float64)
        arrays = {f"storage_{k}": v[: self.size] for k, v in self.storage.items()}
        rng = np.frombuffer(repr(self.rng.bit_generator.state).encode(), dtype=np.uint8)
        priorities = self.priorities[: self.size]
        write_durably(
            folder / "buffer.npz",
            lambda fh: np.savez(fh, scalars=scalars, floats=floats, priorities=priorities, rng=rng, **arrays),
        )

    def load_checkpoint(self, path: str) -> None:
        import ast

        with np.load(Path(path) / "buffer.npz") as saved:
            size, position, capacity = (int(x) for x in saved["scalars"])
            if capacity != self.capacity:
                raise WorkerError(
                    f"the checkpoint's replay buffer shard has capacity {capacity:,}, this run's is"
                    f" {self.capacity:,} (args.capacity over the replicas): resume with the same capacity and replicas"
                )
            self.size, self.position = size, position
            self.owed, self.max_priority = (float(x) for x in saved["floats"])
            self.priorities[: self.size] = saved["priorities"]
            self.rng.bit_generator.state = ast.literal_eval(saved["rng"].tobytes().decode())
            for key in saved.files:
                if key.startswith("storage_"):
                    value = saved[key]
                    self.storage[key.removeprefix("storage_")] = np.zeros(
                        (self.capacity, *value.shape[1:]), dtype=value.dtype
                    )
                    self.storage[key.removeprefix("storage_")][: self.size] = value


def transitions(trajectory: dict[str, Any]) -> dict[str, Any]:
    """One (s, a, r, s', terminal) per env step of a time-major trajectory, flattened [T * envs, ...].

    The next state of step t is the observation of step t + 1, unless an episode ended at t: then it is the
    final observation a time limit cut (`final_obs`, bootstrapped from) or, for a real ending, anything
    (`terminal` masks it). The last step's next state is `next_obs`. A state observation is stored as
    float32; a camera observation (a dict of modalities) keeps each modality's dtype (uint8 images)."""
    steps, envs = np.shape(trajectory["reward"])
    began = np.concatenate([np.asarray(trajectory["done"])[1:], np.asarray(trajectory["next_done"])[None]])
    truncated = np.asarray(trajectory.get("truncated", np.zeros((steps, envs))), dtype=bool)
    terminal = np.logical_and(began.astype(bool), ~truncated)
    final = trajectory.get("final_obs")

    def next_of(obs: np.ndarray, last: np.ndarray, cut_at: np.ndarray | None) -> np.ndarray:
        following = np.concatenate([obs[1:], np.asarray(last, dtype=obs.dtype)[None]])
        if cut_at is None:
            return following
        cut = truncated.reshape(steps, envs, *[1] * (obs.ndim - 2))
        return np.where(cut, np.asarray(cut_at, dtype=obs.dtype), following)

    def flat(x: np.ndarray) -> np.ndarray:
        return x.reshape(steps * envs, *x.shape[2:])

    obs = trajectory["obs"]
    if isinstance(obs, dict):
        if "truncated" not in trajectory:
            raise WorkerError(
                "ReplayBuffer.add: the camera simulator's trajectory does not say which episodes a time limit cut,"
                " so their last transitions would end the return; set bootstrap_time_limits: true in its args"
            )
        modalities = [key for key in obs if key != "env_id"]
        cut_at = {key: None if final is None else final[key] for key in modalities}
        stored = {key: flat(np.asarray(obs[key])) for key in modalities}
        following = {
            key: flat(next_of(np.asarray(obs[key]), trajectory["next_obs"][key], cut_at[key])) for key in modalities
        }
    else:
        state = np.asarray(obs, dtype=np.float32)
        stored = flat(state)
        following = flat(next_of(state, trajectory["next_obs"], None if final is None else np.asarray(final)))
    return {
        "obs": stored,
        "action": flat(np.asarray(trajectory["action"], dtype=np.float32)),
        "reward": flat(np.asarray(trajectory["reward"], dtype=np.float32)),
        "next_obs": following,
        "terminal": flat(terminal.astype(np.float32)),
    }


def _flat_fields(batch: dict[str, Any]) -> dict[str, np.ndarray]:
    """Dict-valued fields (a camera observation) as one field per key: {"obs": {"rgb": x}} -> {"obs.rgb": x}."""
    out: dict[str, np.ndarray] = {}
    for name, value in batch.items():
        if isinstance(value, dict):
            out.update({f"{name}{SEPARATOR}{key}": v for key, v in value.items()})
        else:
            out[name] = value
    return out


def _nested_fields(batch: dict[str, np.ndarray]) -> dict[str, Any]:
    """The inverse of `_flat_fields`."""
    out: dict[str, Any] = {}
    for name, value in batch.items():
        field, _, key = name.partition(SEPARATOR)
        if key:
            out.setdefault(field, {})[key] = value
        else:
            out[name] = value
    return out
