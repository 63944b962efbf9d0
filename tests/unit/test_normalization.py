"""The simulators' observation normaliser: gymnasium's `NormalizeObservation` and clip, computed cheaper."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from m2flow.workers.env.normalization import ClippedNormalization
from m2flow.workers.env.obs_statistics import normalizers


@pytest.mark.parametrize("env_id", ["HalfCheetah-v5", "Pendulum-v1"])  # float64 and float32 observations
def test_the_statistics_and_observations_are_bit_identical_to_gymnasiums_wrapper_and_clip(env_id):
    ours = ClippedNormalization(gym.make(env_id), clip=2.0)
    theirs = gym.wrappers.NormalizeObservation(gym.make(env_id))
    rng = np.random.default_rng(0)
    pairs = [(ours.reset(seed=5)[0], np.clip(theirs.reset(seed=5)[0], -2.0, 2.0))]
    for _ in range(300):
        action = rng.uniform(-1, 1, ours.action_space.shape).astype(np.float32)
        pairs.append((ours.step(action)[0], np.clip(theirs.step(action)[0], -2.0, 2.0)))
    for mine, reference in pairs:
        assert mine.dtype == reference.dtype == np.float32
        np.testing.assert_array_equal(mine, reference)
    np.testing.assert_array_equal(ours.obs_rms.mean, theirs.obs_rms.mean)
    np.testing.assert_array_equal(ours.obs_rms.var, theirs.obs_rms.var)
    assert ours.obs_rms.count == theirs.obs_rms.count == pytest.approx(301, abs=1e-3)
    assert any(np.abs(mine).max() == 2.0 for mine, _ in pairs)  # the clip was reached, and matched


class Counts(gym.Env):
    """Integer observations: three counters that grow by the action's size each step."""

    observation_space = gym.spaces.Box(0, 255, (3,), np.uint8)
    action_space = gym.spaces.Discrete(4)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.counts = np.zeros(3, np.uint8)
        return self.counts.copy(), {}

    def step(self, action):
        self.counts = (self.counts + np.uint8(action) * np.arange(1, 4, dtype=np.uint8)) % 200
        return self.counts.copy(), 0.0, False, False, {}


def test_integer_observations_are_normalised_as_gymnasium_does_in_float64():
    ours, theirs = ClippedNormalization(Counts(), clip=5.0), gym.wrappers.NormalizeObservation(Counts())
    ours.reset(seed=0), theirs.reset(seed=0)
    for action in [1, 3, 2, 0, 3, 1, 2, 2, 3, 1] * 5:
        np.testing.assert_array_equal(ours.step(action)[0], np.clip(theirs.step(action)[0], -5.0, 5.0))
    assert ours.obs_rms.mean.dtype == theirs.obs_rms.mean.dtype
    np.testing.assert_array_equal(ours.obs_rms.mean, theirs.obs_rms.mean)
    np.testing.assert_array_equal(ours.obs_rms.var, theirs.obs_rms.var)


def test_a_frozen_normaliser_reads_its_statistics_without_updating_them():
    env = ClippedNormalization(gym.make("HalfCheetah-v5"), clip=10.0)
    env.reset(seed=0)
    (found,) = normalizers([env])
    assert found is env
    env.update_running_mean = False
    mean, var, count = env.obs_rms.mean.copy(), env.obs_rms.var.copy(), env.obs_rms.count
    observation = env.step(np.zeros(6, np.float32))[0]
    assert env.obs_rms.count == count
    np.testing.assert_array_equal(env.obs_rms.mean, mean)
    expected = np.clip(np.float32((env.unwrapped._get_obs() - mean) / np.sqrt(var + env.epsilon)), -10.0, 10.0)
    np.testing.assert_array_equal(observation, expected)
