"""Training workers and their backends."""

from m2flow.workers.actor import megatron_backend  # noqa: F401  (registers backend: megatron)
from m2flow.workers.actor.backends import BackendOptions, TrainingBackend, get_backend, register_backend
from m2flow.workers.actor.ppo import PPO, PPOConfig, read_checkpoint

__all__ = [
    "PPO",
    "BackendOptions",
    "PPOConfig",
    "TrainingBackend",
    "get_backend",
    "read_checkpoint",
    "register_backend",
]
