"""Inference workers."""

from m2flow.workers.models import PolicyArgs
from m2flow.workers.rollout.torch_policy import TorchPolicy

__all__ = ["PolicyArgs", "TorchPolicy"]
