"""Inference workers."""

from m2flow.workers.rollout.torch_policy import PolicyArgs, TorchPolicy

__all__ = ["PolicyArgs", "TorchPolicy"]
