"""PPO's arguments: CleanRL's `ppo_continuous_action.py` ones with its defaults, plus GRPO, minibatch-size and
off-policy options (light: the dry run validates them without torch)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from m2flow.workers.actor.backends import BackendOptions
from m2flow.workers.models import PolicyArgs


class PPOConfig(PolicyArgs, BackendOptions):
    """CleanRL's `ppo_continuous_action.py` arguments (its defaults), plus GRPO and minibatch-size options."""

    learning_rate: float = Field(3e-4, gt=0, description="Adam's learning rate (eps 1e-5)")
    anneal_lr: bool = Field(True, description="decay the learning rate linearly to 0 over the run's iterations")
    gamma: float = Field(0.99, ge=0, le=1, description="discount factor")
    gae_lambda: float = Field(0.95, ge=0, le=1, description="GAE's lambda")
    num_minibatches: int = Field(32, ge=1, description="minibatches per epoch (the batch is every env step)")
    minibatch_size: int | None = Field(None, ge=1, description="samples per minibatch instead (SB3's batch_size)")
    update_epochs: int = Field(10, ge=1, description="passes over the batch per update")
    norm_adv: bool = Field(True, description="normalise advantages per minibatch")
    clip_coef: float = Field(0.2, gt=0, description="the surrogate's ratio clip (and the value clip)")
    clip_vloss: bool = Field(True, description="clip the value loss as CleanRL does")
    ent_coef: float = Field(0.0, description="entropy bonus coefficient")
    vf_coef: float = Field(0.5, description="value loss coefficient")
    max_grad_norm: float = Field(0.5, gt=0, description="gradient clipping by global norm")
    target_kl: float | None = Field(None, description="stop the epochs once the approximate KL exceeds this")
    normalize_reward: bool = Field(True, description="scale rewards by the running std of the discounted return")
    advantage: Literal["gae", "grpo"] = Field("gae", description="gae: critic-based; grpo: group-relative")
    group_size: int = Field(1, ge=1, description="GRPO: envs per group (adjacent env ids)")
    grpo_normalize_std: bool = Field(True, description="GRPO: divide by the group's return std")
    off_policy: Literal["decoupled", "ratio"] = Field(
        "decoupled",
        description="samples an older policy acted on (flow.async): their values are recomputed with the weights"
        " the update starts from; decoupled — so are their log-probs, the ratio is clipped against those and each"
        " sample weighted by their ratio to the acting policy (decoupled PPO); ratio — PPO's ratio to the acting"
        " policy as is",
    )
    behavior_weight_cap: float = Field(2.0, gt=0, description="decoupled: the cap of each sample's weight")

    @model_validator(mode="after")
    def _scores_actions(self) -> PPOConfig:
        if self.model == "squashed":
            raise ValueError("model: squashed is SAC's acting policy; PPO re-scores actions: use mlp, cnn, vit or hf")
        return self

    def minibatch_of(self, batch_size: int) -> int:
        return min(self.minibatch_size or max(1, batch_size // self.num_minibatches), batch_size)
