"""The clipped PPO objective (Schulman et al. 2017) with value clipping and an entropy bonus,
line by line as CleanRL's ppo_continuous_action.py computes it for one minibatch."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PPOLossConfig:
    clip_coef: float = 0.2
    clip_vloss: bool = True
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    norm_adv: bool = True


def normalize_advantages(advantages: torch.Tensor) -> torch.Tensor:
    """Zero mean, unit (sample) std; a minibatch of one sample is only centred."""
    return (advantages - advantages.mean()) / (advantages.std(correction=min(1, len(advantages) - 1)) + 1e-8)


def ppo_loss(
    newlogprob: torch.Tensor,
    entropy: torch.Tensor,
    newvalue: torch.Tensor,
    logprobs: torch.Tensor,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    cfg: PPOLossConfig,
    behavior_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss of one minibatch (advantages already normalised if wanted) and its statistics. Decoupled PPO
    (Hilton et al. 2022) for samples an older policy acted on: `logprobs` are then the proximal policy's
    (the one the update started from), and `behavior_weights` (proximal / acting policy, capped) weigh
    each sample's clipped objective."""
    logratio = newlogprob - logprobs
    ratio = logratio.exp()
    with torch.no_grad():
        approx_kl = ((ratio - 1) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > cfg.clip_coef).float().mean()

    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1 - cfg.clip_coef, 1 + cfg.clip_coef)
    pg_per_sample = torch.max(pg_loss1, pg_loss2)
    pg_loss = (pg_per_sample * behavior_weights if behavior_weights is not None else pg_per_sample).mean()

    if cfg.clip_vloss:
        v_loss_unclipped = (newvalue - returns) ** 2
        v_clipped = values + torch.clamp(newvalue - values, -cfg.clip_coef, cfg.clip_coef)
        v_loss_clipped = (v_clipped - returns) ** 2
        v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
        with torch.no_grad():
            value_clip_ratio = (v_loss_clipped > v_loss_unclipped).float().mean()
    else:
        v_loss = 0.5 * ((newvalue - returns) ** 2).mean()
        value_clip_ratio = newvalue.new_zeros(())

    entropy_loss = entropy.mean()
    loss = pg_loss - cfg.ent_coef * entropy_loss + v_loss * cfg.vf_coef
    stats = {
        "pg_loss": pg_loss.detach(),
        "value_loss": v_loss.detach(),
        "entropy": entropy_loss.detach(),
        "approx_kl": approx_kl,
        "pg_clipfrac": clipfrac,
        "value_clip_ratio": value_clip_ratio,
    }
    return loss, stats
