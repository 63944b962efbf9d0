"""The batch of one PPO update, assembled from its parts (one per simulator shard, possibly streamed in
early): time-major tensors on the device, the observations its bootstrap values are of, and the advantage
estimators by name. Torch is imported where it runs (the dry run imports this module without it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from m2flow.errors import WorkerError

if TYPE_CHECKING:
    import torch

    from m2flow.workers.actor.ppo_config import PPOConfig

TIME_MAJOR = ("obs", "action", "logprob", "value", "reward", "done", "truncated", "final_value", "policy_version")


@dataclass(frozen=True)
class AdvantageInputs:
    """What an advantage estimator reads of an update's batch, time-major [T, envs]: the rewards (scaled, and
    bootstrapped where a time limit cut an episode), the critic's values, the done flags, the value (GAE only:
    None for GRPO, which has no critic) and done after the last step, and the global index of each env
    (column)."""

    rewards: torch.Tensor
    values: torch.Tensor
    dones: torch.Tensor
    next_value: torch.Tensor | None
    next_done: torch.Tensor
    env_ids: torch.Tensor


def gae_advantages(cfg: PPOConfig, x: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    from m2flow.workers.algorithms import compute_gae

    return compute_gae(x.rewards, x.values, x.dones, x.next_value, x.next_done, cfg.gamma, cfg.gae_lambda)


def grpo_advantages(cfg: PPOConfig, x: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Each env's return over the iteration, relative to its group; the same advantage at every step. A
    group's envs must sit on one data-parallel rank: the rank's share holds whole groups."""
    from m2flow.workers.algorithms import group_advantages

    size = cfg.group_size
    if x.rewards.shape[1] % size or bool((x.env_ids[::size] % size).any()):
        raise WorkerError(
            f"GRPO groups of {size} adjacent envs straddle this rank's share ({x.rewards.shape[1]} envs from env"
            f" {int(x.env_ids[0])}): make each simulator replica's num_envs a multiple of group_size"
        )
    per_env = group_advantages(x.rewards.sum(dim=0), size, cfg.grpo_normalize_std)
    advantages = per_env.expand_as(x.rewards).contiguous()
    return advantages, advantages  # no critic: the value loss is switched off (vf_coef 0)


ADVANTAGES = {"gae": gae_advantages, "grpo": grpo_advantages}


@dataclass(frozen=True)
class Bootstrap:
    """A part's observations on the device that its GAE bootstrap values are of: the last one, and the
    final ones of the episodes a time limit cut short (`cut`: their rows in [T * envs]; at least one row
    goes through the model)."""

    next_obs: Any
    final_obs: Any | None
    cut: np.ndarray

    @classmethod
    def of(cls, model: Any, trajectory: dict[str, Any], device: torch.device) -> Bootstrap:
        from m2flow.workers.actor.samples import apply_to_obs

        next_obs = model.inputs(trajectory["next_obs"], device)
        if "final_obs" not in trajectory:
            return cls(next_obs, None, np.zeros(0, dtype=np.int64))
        cut = np.flatnonzero(np.asarray(trajectory["truncated"]).reshape(-1))
        rows = cut if len(cut) else np.zeros(1, dtype=np.int64)
        final = apply_to_obs(flatten(trajectory["final_obs"]), lambda x: x[rows])
        return cls(next_obs, model.inputs(final, device), cut)


@dataclass(frozen=True)
class Part:
    """One part of the batch on the device, as `train_part` prepared it; its bootstrap values wait for `train`."""

    tensors: dict[str, Any]
    bootstrap: Bootstrap | None


def cat(parts: list[Any], dim: int) -> Any:
    """Parts side by side along the env axis (a tensor or a dict of them)."""
    import torch

    if isinstance(parts[0], dict):
        return {key: cat([p[key] for p in parts], dim) for key in parts[0]}
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)


def time_major(obs: Any, steps: int, envs: int) -> Any:
    """[T*N, ...] -> [T, N, ...] (a tensor or a dict of them)."""
    if isinstance(obs, dict):
        return {key: time_major(value, steps, envs) for key, value in obs.items()}
    return obs.reshape(steps, envs, *obs.shape[1:])


def flatten(obs: Any) -> Any:
    """Time-major [T, N, ...] observations (an array or a dict of them) -> [T*N, ...]."""
    if isinstance(obs, dict):
        return {key: flatten(value) for key, value in obs.items()}
    return obs.reshape(-1, *obs.shape[2:])
