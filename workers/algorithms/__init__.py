"""RL algorithms as small functions, each checkable against its paper and CleanRL."""

from m2flow.workers.algorithms.gae import compute_gae
from m2flow.workers.algorithms.grpo import group_advantages
from m2flow.workers.algorithms.ppo_loss import PPOLossConfig, normalize_advantages, ppo_loss
from m2flow.workers.algorithms.reward_scaling import ReturnScaler

__all__ = ["PPOLossConfig", "ReturnScaler", "compute_gae", "group_advantages", "normalize_advantages", "ppo_loss"]
