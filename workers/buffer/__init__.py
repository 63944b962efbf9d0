"""Buffer workers: transitions kept between iterations for off-policy training."""

from m2flow.workers.buffer.replay import ReplayBuffer, ReplayBufferConfig, transitions

__all__ = ["ReplayBuffer", "ReplayBufferConfig", "transitions"]
