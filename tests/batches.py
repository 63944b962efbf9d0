"""Batches the unit tests hand workers directly, as the workers upstream of them would send them."""

from __future__ import annotations

import numpy as np


def pendulum_minibatches(updates: int, size: int) -> dict[str, np.ndarray]:
    """What `ReplayBuffer.sample` hands SAC for Pendulum: [updates, size, ...] per field."""
    rng = np.random.default_rng(0)
    return {
        "obs": rng.normal(size=(updates, size, 3)).astype(np.float32),
        "action": rng.uniform(-2, 2, size=(updates, size, 1)).astype(np.float32),
        "reward": rng.normal(size=(updates, size)).astype(np.float32),
        "next_obs": rng.normal(size=(updates, size, 3)).astype(np.float32),
        "terminal": np.zeros((updates, size), np.float32),
        "index": np.arange(updates * size).reshape(updates, size),
    }
