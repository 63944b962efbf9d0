"""Training workers and their backends."""

from m2flow.workers.actor import megatron_backend  # noqa: F401  (registers backend: megatron)
from m2flow.workers.actor.backends import TrainingBackend, get_backend, register_backend
from m2flow.workers.actor.ppo import PPO, PPOConfig

__all__ = ["PPO", "PPOConfig", "TrainingBackend", "get_backend", "register_backend"]
