"""gymnasium's `NormalizeObservation` with the clip to ±`obs_clip` folded in, at a fraction of its cost a step.

A camera simulator's physics steps are where its process spends its time, and gymnasium's wrapper updates its
running statistics through `RunningMeanStd.update`: a batch mean and variance of one row, then their merge; the
clip is a second wrapper. Together they nearly doubled a HalfCheetah step (`benchmarks/step_cost.py`). One
observation's update needs neither: its batch mean is itself and its variance zero, so the merge reduces to the
few operations below, the same ones in the same order (the statistics and observations are bit-identical to the
wrapper's and clip's, tested). Everything else is the wrapper's: `obs_rms`, `update_running_mean`, `epsilon`,
what `obs_statistics.normalizers` finds.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class ClippedNormalization(gym.wrappers.NormalizeObservation):
    """Observations normalised by their running mean and variance, then clipped to ±`clip`."""

    def __init__(self, env: gym.Env, clip: float):
        super().__init__(env)
        self.clip = clip

    def observation(self, observation: Any) -> np.ndarray:
        """The observation normalised (and the statistics updated with it, unless frozen), then clipped."""
        observation = np.asarray(observation)
        if not np.issubdtype(observation.dtype, np.floating):  # as gymnasium's batch mean of it: float64
            observation = observation.astype(np.float64)
        rms = self.obs_rms
        if self._update_running_mean:  # RunningMeanStd.update of one row: batch mean the row, variance zero
            delta = observation - rms.mean
            total = rms.count + 1
            rms.mean = rms.mean + delta / total
            rms.var = (rms.var * rms.count + np.square(delta) * rms.count / total) / total
            rms.count = total
        normalised = np.float32((observation - rms.mean) / np.sqrt(rms.var + self.epsilon))
        return np.clip(normalised, -self.clip, self.clip)
