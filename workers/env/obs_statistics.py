"""Observation normalisation in a simulator: a running mean and variance of each env's observation vector
(the proprioception of a camera simulator; images are left to the policy), as CleanRL's
`ppo_continuous_action.py` wraps each env (gymnasium's `NormalizeObservation`, then a clip to ±`obs_clip`),
or one per replica as SB3's `VecNormalize` keeps for its vector of envs (`share_obs_statistics`; updated in the
order the schedule steps the envs, so pipeline slices and replica counts change a run's numbers, which per-env
statistics never do).

The policy, the trajectories and the bootstrap observation all see normalised observations; the statistics are
part of the simulator's checkpointed state (`statistics_arrays` / `load_statistics_arrays`), and evaluation
reads them frozen (`frozen`, `freeze_at`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import Field, model_validator

from m2flow.strict_numbers import NumbersNotBooleans

if TYPE_CHECKING:
    import gymnasium as gym

    import m2flow


class ObsNormalization(NumbersNotBooleans):
    """A simulator config's observation normalisation settings."""

    normalize_obs: bool = Field(
        True, description="normalise the observation vector (a camera env's proprio) per env with running statistics"
    )
    share_obs_statistics: bool = Field(
        False, description="one running mean and variance for the envs of a replica (as VecNormalize), not one per env"
    )
    obs_clip: float = Field(10.0, gt=0, description="normalised observations are clipped to +-obs_clip")

    @model_validator(mode="after")
    def _statistics_to_share(self) -> ObsNormalization:
        if self.share_obs_statistics and not self.normalize_obs:
            raise ValueError(
                "share_obs_statistics: true shares the observation normaliser's statistics, but normalize_obs is"
                " false: set normalize_obs: true, or leave share_obs_statistics out"
            )
        return self


def normalized(env: gym.Env, settings: ObsNormalization) -> gym.Env:
    """`env` with its observations normalised and clipped as the settings ask (unchanged when they do not)."""
    if not settings.normalize_obs:
        return env
    from m2flow.workers.env.normalization import ClippedNormalization

    return ClippedNormalization(env, settings.obs_clip)


def frozen(env: gym.Env) -> gym.Env:
    """`env` with its normaliser (if any) no longer updated: an evaluation env, given statistics to read."""
    for norm in normalizers([env]):
        norm.update_running_mean = False
    return env


def freeze_at(env: gym.Env, envs: list[gym.Env]) -> None:
    """Give the (frozen) evaluation `env` the merged statistics of the training `envs` of this moment."""
    for norm in normalizers([env]):
        norm.obs_rms.mean, norm.obs_rms.var, norm.obs_rms.count = merged_statistics(envs)


_REPLICA_ENVS: dict[tuple[str, int], list[gym.Env]] = {}  # this process's replicas: the envs of their slices


def replica_envs(ctx: m2flow.WorkerContext, envs: list[gym.Env]) -> list[gym.Env]:
    """The envs of every pipeline slice of this replica that this process has built, these included (one
    list, extended as the host builds the next slices; a replica's first slice starts it anew)."""
    key = (ctx.worker, ctx.replica)
    if ctx.stage == 0:
        _REPLICA_ENVS[key] = []
    _REPLICA_ENVS.setdefault(key, []).extend(envs)
    return _REPLICA_ENVS[key]


def share_statistics(envs: list[gym.Env]) -> None:
    """Make every env's observation normaliser update and read the first one's running statistics."""
    found = normalizers(envs)
    for norm in found[1:]:
        norm.obs_rms = found[0].obs_rms


def merged_statistics(envs: list[gym.Env]) -> tuple[np.ndarray, np.ndarray, float]:
    """The observation statistics of all `envs` together (mean, variance, count); statistics the envs share
    count once."""
    from m2flow.workers.algorithms.moments import merge

    rms = list({id(norm.obs_rms): norm.obs_rms for norm in normalizers(envs)}.values())
    moments = (rms[0].mean, rms[0].var, rms[0].count)
    for r in rms[1:]:
        moments = merge(*moments, (r.mean, r.var, r.count))
    return moments


def statistics_arrays(envs: list[gym.Env]) -> dict[str, np.ndarray]:
    """Each env's statistics as the arrays a simulator's state holds (none without normalisation)."""
    rms = [norm.obs_rms for norm in normalizers(envs)]
    if not rms:
        return {}
    return {
        "obs_mean": np.stack([r.mean for r in rms]),
        "obs_var": np.stack([r.var for r in rms]),
        "obs_count": np.array([r.count for r in rms]),
    }


def load_statistics_arrays(envs: list[gym.Env], arrays: dict[str, Any]) -> bool:
    """Each env's statistics from a state's arrays (`statistics_arrays`); whether any were kept (the arrays held
    them and the envs normalise)."""
    found = normalizers(envs)
    if "obs_mean" not in arrays or not found:
        return False
    for i, norm in enumerate(found):
        norm.obs_rms.mean, norm.obs_rms.var = np.array(arrays["obs_mean"][i]), np.array(arrays["obs_var"][i])
        norm.obs_rms.count = float(arrays["obs_count"][i])
    return True


def normalizers(envs: list[gym.Env]) -> list[gym.wrappers.NormalizeObservation]:
    """The observation normaliser of each env (none when the config switches it off)."""
    import gymnasium as gym

    found = []
    for env in envs:
        while isinstance(env, gym.Wrapper) and not isinstance(env, gym.wrappers.NormalizeObservation):
            env = env.env
        if isinstance(env, gym.wrappers.NormalizeObservation):
            found.append(env)
    return found
