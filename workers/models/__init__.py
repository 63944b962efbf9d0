"""Policy models shared by inference and training workers."""

from m2flow.workers.models.mlp import GaussianMLP, PolicyConfig, build_policy, env_dims, state_bytes, state_checksum

__all__ = ["GaussianMLP", "PolicyConfig", "build_policy", "env_dims", "state_bytes", "state_checksum"]
