"""Training workers and their backends."""

from m2flow.workers.actor.backends import BackendOptions, TrainingBackend, get_backend, register_backend
from m2flow.workers.actor.ppo import PPO, PPOConfig
from m2flow.workers.actor.ppo_checkpoint import read_checkpoint
from m2flow.workers.actor.sac import SAC, SACConfig

__all__ = [
    "PPO",
    "SAC",
    "BackendOptions",
    "PPOConfig",
    "SACConfig",
    "TrainingBackend",
    "get_backend",
    "read_checkpoint",
    "register_backend",
]
