"""Policy models shared by inference and training workers, built by name from `PolicyArgs`."""

from m2flow.workers.models.cnn import CNNPolicy
from m2flow.workers.models.mlp import GaussianMLP, checksum_matches, env_dims, state_checksum
from m2flow.workers.models.policy import MODELS, PolicyArgs, state_bytes

__all__ = [
    "MODELS",
    "CNNPolicy",
    "GaussianMLP",
    "PolicyArgs",
    "checksum_matches",
    "env_dims",
    "state_bytes",
    "state_checksum",
]
