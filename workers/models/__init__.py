"""Policies: their typed args and sizes (light, for the planner) — the torch models live in the modules
beside them (`policy.MODELS`)."""

from m2flow.workers.models.policy_args import PolicyArgs
from m2flow.workers.models.sizes import StateSize, state_bytes, state_size

__all__ = ["PolicyArgs", "StateSize", "state_bytes", "state_size"]
