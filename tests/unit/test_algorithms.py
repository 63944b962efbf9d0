"""Algorithms checked by hand on tiny cases, and the batching rules of the loop."""

from __future__ import annotations

from contextlib import nullcontext
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from m2flow.runtime.batching import BatchingError, concat, split
from m2flow.sharding import owner, shard_groups, slice_sizes
from m2flow.workers.algorithms import PPOLossConfig, ReturnScaler, compute_gae, ppo_loss
from m2flow.workers.algorithms.moments import across_ranks, merge


def test_gae_by_hand_with_an_episode_boundary():
    gamma, lam = 0.9, 0.5
    rewards = torch.tensor([[1.0], [2.0], [3.0]])
    values = torch.tensor([[0.5], [1.0], [1.5]])
    dones = torch.tensor([[0.0], [0.0], [1.0]])  # obs[2] starts a new episode
    next_value, next_done = torch.tensor([2.0]), torch.tensor([0.0])
    adv, ret = compute_gae(rewards, values, dones, next_value, next_done, gamma, lam)
    d2 = 3.0 + gamma * 2.0 - 1.5
    d1 = 2.0 + 0.0 - 1.0  # the step into obs[2] is terminal: no bootstrap
    d0 = 1.0 + gamma * 1.0 - 0.5
    a2, a1 = d2, d1
    a0 = d0 + gamma * lam * a1
    assert adv[:, 0].tolist() == pytest.approx([a0, a1, a2])
    assert ret[:, 0].tolist() == pytest.approx([a0 + 0.5, a1 + 1.0, a2 + 1.5])


def test_ppo_loss_clips_the_ratio_and_the_value():
    cfg = PPOLossConfig(clip_coef=0.2, ent_coef=0.0, vf_coef=0.5)
    old = torch.zeros(2)
    new = torch.log(torch.tensor([1.5, 0.5]))  # ratios 1.5 and 0.5: both outside [0.8, 1.2]
    adv = torch.tensor([1.0, -1.0])
    loss, stats = ppo_loss(
        new,
        torch.zeros(2),
        torch.tensor([2.0, 0.0]),
        old,
        adv,
        returns=torch.tensor([1.0, 0.0]),
        values=torch.tensor([0.0, 0.0]),
        cfg=cfg,
    )
    # pg: max(-1*1.5, -1*1.2) = -1.2 ; max(1*0.5, 1*0.8) = 0.8 -> mean -0.2
    assert float(stats["pg_loss"]) == pytest.approx(-0.2)
    # value: unclipped (2-1)^2=1, clipped (0.2-1)^2=0.64 -> max 1 ; second 0 -> 0.5*mean = 0.25
    assert float(stats["value_loss"]) == pytest.approx(0.25)
    assert float(stats["pg_clipfrac"]) == 1.0
    assert float(loss) == pytest.approx(-0.2 + 0.5 * 0.25)


def gym_env(**args):
    from m2flow.context import WorkerContext, set_context
    from m2flow.workers.env import GymEnv

    set_context(WorkerContext(items=(0, 2), seed=3))
    return GymEnv(env_id="HalfCheetah-v5", num_envs=2, **args)


def test_a_simulator_started_anew_keeps_the_observation_statistics_and_resets_its_envs():
    from m2flow.workers.env.obs_statistics import normalizers

    env, anew = gym_env(), gym_env()
    env.obs()
    for _ in range(20):
        env.step(np.full((2, 6), 0.5, np.float32))
    assert anew.load_statistics(env.state_dict())

    for kept, learned in zip(normalizers(anew.envs.envs), normalizers(env.envs.envs), strict=True):
        np.testing.assert_array_equal(kept.obs_rms.mean, learned.obs_rms.mean)
        np.testing.assert_array_equal(kept.obs_rms.var, learned.obs_rms.var)
        assert kept.obs_rms.count == learned.obs_rms.count
    anew.obs()
    assert [e.unwrapped.data.time for e in anew.envs.envs] == [0.0, 0.0]  # new episodes, not the saved physics
    assert all(e.unwrapped.data.time > 0 for e in env.envs.envs)
    assert not gym_env().load_statistics({})  # a state before any step holds no statistics


def test_observations_are_normalised_per_env_and_the_statistics_resume_exactly():
    import gymnasium as gym

    env, raw = gym_env(), gym_env(normalize_obs=False)
    reference = gym.wrappers.NormalizeObservation(gym.make("HalfCheetah-v5"))  # env 0, as CleanRL wraps it
    expected = reference.reset(seed=3)[0]
    np.testing.assert_allclose(env.obs()["obs"][0], expected, rtol=1e-5, atol=1e-6)
    raw.obs()
    rng = np.random.default_rng(0)
    for _ in range(30):
        action = rng.uniform(-1, 1, (2, 6)).astype(np.float32)
        obs, plain = env.step(action)["obs"], raw.step(action)["obs"]
        expected = reference.step(action[0])[0]
    np.testing.assert_allclose(obs[0], np.clip(expected, -10, 10), rtol=1e-4, atol=1e-5)
    assert not np.allclose(obs, plain)  # the raw env's observations are not normalised
    resumed = gym_env()
    resumed.load_state_dict(env.state_dict())
    action = rng.uniform(-1, 1, (2, 6)).astype(np.float32)
    np.testing.assert_array_equal(resumed.step(action)["obs"], env.step(action)["obs"])


def test_shared_observation_statistics_are_one_running_mean_over_every_env_of_the_replica():
    from m2flow.workers.env.obs_statistics import merged_statistics

    env, raw = gym_env(share_obs_statistics=True), gym_env(normalize_obs=False)
    seen = [raw.obs()["obs"]]
    env.obs()
    rng = np.random.default_rng(1)
    for _ in range(25):
        action = rng.uniform(-1, 1, (2, 6)).astype(np.float32)
        obs, plain = env.step(action)["obs"], raw.step(action)["obs"]
        seen.append(plain)
    every = np.concatenate(seen)  # both envs' raw observations: the statistics of all of them, as one
    mean, var, count = merged_statistics(env.envs.envs)
    np.testing.assert_allclose(mean, every.mean(axis=0), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(var, every.var(axis=0), rtol=1e-3, atol=1e-6)
    assert round(count) == len(every)  # counted once, not once per env
    last = np.clip((plain[-1] - mean) / np.sqrt(var + 1e-8), -10, 10)  # the last env stepped saw every update
    np.testing.assert_allclose(obs[-1], last, rtol=1e-4, atol=1e-4)


def slices_of_one_replica(**args):
    """A replica of 4 envs built as its host builds two pipeline slices, in one process."""
    from m2flow.context import WorkerContext, set_context
    from m2flow.workers.env import GymEnv

    slices = []
    for stage, items in enumerate([(0, 2), (2, 4)]):
        set_context(WorkerContext(worker="env", stage=stage, stages=2, items=items, replica_items=(0, 4), seed=3))
        slices.append(GymEnv(env_id="HalfCheetah-v5", num_envs=4, **args))
    return slices


def test_shared_observation_statistics_span_the_pipeline_slices_of_a_replica():
    from m2flow.workers.env.obs_statistics import normalizers

    first, second = slices_of_one_replica(share_obs_statistics=True)
    shared = {id(norm.obs_rms) for norm in normalizers([*first.envs.envs, *second.envs.envs])}
    assert len(shared) == 1
    first.obs(), second.obs()
    assert round(normalizers(first.envs.envs)[0].obs_rms.count) == 4  # each slice's resets counted in the one


def test_evaluation_normalises_with_the_statistics_of_every_slice_of_the_replica():
    from m2flow.workers.env.obs_statistics import merged_statistics

    first, second = slices_of_one_replica()  # statistics per env
    first.obs(), second.obs()
    assert first.replica_envs == [*first.envs.envs, *second.envs.envs]
    assert round(merged_statistics(first.replica_envs)[2]) == 4  # one reset of each of the 4 envs


def test_sharing_statistics_without_normalising_is_refused_naming_both_keys():
    from pydantic import ValidationError

    from m2flow.workers.env.gym_env import GymEnvConfig

    with pytest.raises(ValidationError, match="share_obs_statistics: true .* normalize_obs is false"):
        GymEnvConfig(env_id="HalfCheetah-v5", share_obs_statistics=True, normalize_obs=False)


def reference_scaled_rewards(rewards: np.ndarray, dones: np.ndarray, gamma: float) -> np.ndarray:
    """gymnasium's NormalizeReward arithmetic, over all envs of a step, in plain numpy."""
    returns, mean, var, count = np.zeros(rewards.shape[1]), 0.0, 1.0, 1e-4
    out = np.empty_like(rewards)
    for t in range(len(rewards)):
        returns = returns * gamma * (1 - dones[t]) + rewards[t]
        batch_mean, batch_var, n = returns.mean(), returns.var(), len(returns)
        delta, total = batch_mean - mean, count + n
        mean, var = mean + delta * n / total, (var * count + batch_var * n + delta**2 * count * n / total) / total
        count = total
        out[t] = np.clip(rewards[t] / np.sqrt(var + 1e-8), -10, 10)
    return out


def test_return_scaler_scales_rewards_as_gymnasiums_normalize_reward():
    rng = np.random.default_rng(0)
    rewards, dones = rng.normal(2, 3, size=(50, 6)), (rng.random((50, 6)) < 0.1).astype(float)
    scaler = ReturnScaler(num_envs=6, gamma=0.99)
    scaled = scaler(torch.tensor(rewards, dtype=torch.float32), torch.tensor(dones), torch.arange(6))
    expected = reference_scaled_rewards(rewards.astype(np.float32).astype(float), dones, 0.99)
    np.testing.assert_allclose(scaled.numpy(), expected, rtol=1e-5)


def test_return_scaler_on_two_ranks_scales_like_one():
    """Envs split over two data-parallel ranks: the per-step moments are merged, so each rank scales its
    envs exactly as one rank holding every env does (the other rank's moments replayed here)."""
    rng = np.random.default_rng(1)
    rewards = torch.tensor(rng.normal(size=(20, 8)), dtype=torch.float32)
    dones = torch.tensor((rng.random((20, 8)) < 0.1).astype(np.float32))
    whole = ReturnScaler(8, 0.9)(rewards, dones, torch.arange(8))
    recorded = []
    ReturnScaler(8, 0.9)(rewards[:, 4:], dones[:, 4:], torch.arange(4, 8), lambda *m: recorded.append(m) or m)
    steps = iter(recorded)
    combine = across_ranks(lambda local: torch.stack([local, torch.cat([*map(_flat, next(steps))])]))
    first = ReturnScaler(8, 0.9)(rewards[:, :4], dones[:, :4], torch.arange(4), combine)
    torch.testing.assert_close(first, whole[:, :4], rtol=1e-6, atol=1e-6)


def _flat(value) -> torch.Tensor:
    return torch.as_tensor(value, dtype=torch.float64).reshape(-1)


def test_merged_moments_equal_the_whole_batchs():
    x = torch.randn(100, 3, dtype=torch.float64)
    parts = [(p.mean(0), p.var(0, unbiased=False), torch.tensor(float(len(p)))) for p in (x[:30], x[30:])]
    mean, var, n = merge(*parts[0], parts[1])
    torch.testing.assert_close(mean, x.mean(0))
    torch.testing.assert_close(var, x.var(0, unbiased=False))
    assert float(n) == 100


def test_concat_and_split_are_inverse():
    parts = [{"a": np.arange(3), "b": np.ones((3, 2))}, {"a": np.arange(2), "b": np.zeros((2, 2))}]
    merged, sizes = concat(parts)
    assert sizes == [3, 2] and merged["a"].tolist() == [0, 1, 2, 0, 1]
    back = split(merged, sizes)
    assert [p["a"].tolist() for p in back] == [[0, 1, 2], [0, 1]]


def test_non_array_values_cannot_be_batched():
    with pytest.raises(BatchingError, match="loop ports exchange numpy arrays"):
        concat(["x", "y"])


def test_shards_group_contiguously():
    assert shard_groups(4, 2) == [[0, 1], [2, 3]]
    assert shard_groups(3, 1) == [[0, 1, 2]]
    assert [owner(s, 4, 2) for s in range(4)] == [0, 0, 1, 1]
    assert slice_sizes(5, 2) == [3, 2]


def test_grpo_advantages_by_hand():
    from m2flow.workers.algorithms import group_advantages

    returns = torch.tensor([1.0, 3.0, 10.0, 10.0])  # two groups of two
    assert group_advantages(returns, 2, normalize_std=False).tolist() == [-1.0, 1.0, 0.0, 0.0]
    normed = group_advantages(returns, 2)  # group std 1 and 0
    assert normed[:2].tolist() == pytest.approx([-1.0, 1.0], abs=1e-5) and normed[2:].tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="do not split into groups of 3"):
        group_advantages(returns, 3)


def test_a_time_limit_is_recorded_with_its_final_observation_to_bootstrap_from():
    env = gym_env(env_kwargs={"max_episode_steps": 5})
    env.obs()
    for _ in range(7):
        env.step(np.zeros((2, 6), np.float32))
    trajectory = env.trajectory()
    assert trajectory["truncated"].tolist() == [[0, 0]] * 4 + [[1, 1]] + [[0, 0]] * 2  # the 5th step hit the limit
    assert np.abs(trajectory["final_obs"][4]).sum() > 0 and not trajectory["final_obs"][[0, 1, 2, 3, 5, 6]].any()
    assert trajectory["done"][5].tolist() == [1, 1]  # the next step starts a new episode: GAE stops there


def test_ppo_bootstraps_the_value_of_episodes_a_time_limit_cut_in_train_not_in_a_streamed_part():
    from m2flow.context import WorkerContext, set_context
    from m2flow.workers.actor import PPO

    set_context(WorkerContext(worker="actor", kind="training", iterations=1))
    ppo = PPO(env_id="HalfCheetah-v5", hidden=[8], normalize_reward=False)
    rng = np.random.default_rng(0)
    steps, envs = 4, 2
    trajectory = {
        "obs": rng.normal(size=(steps, envs, 17)).astype(np.float32),
        "action": rng.normal(size=(steps, envs, 6)).astype(np.float32),
        "logprob": np.zeros((steps, envs), np.float32),
        "value": np.zeros((steps, envs), np.float32),
        "reward": np.zeros((steps, envs), np.float32),
        "done": np.zeros((steps, envs), np.float32),
        "truncated": np.zeros((steps, envs), np.float32),
        "final_obs": np.zeros((steps, envs, 17), np.float32),
        "next_obs": rng.normal(size=(envs, 17)).astype(np.float32),
        "next_done": np.zeros(envs, np.float32),
    }
    trajectory["truncated"][1, 0] = 1.0
    trajectory["final_obs"][1, 0] = rng.normal(size=17)
    part = ppo._with_values(ppo._prepare(trajectory))
    with torch.no_grad():
        expected = ppo.model.get_value(torch.tensor(trajectory["final_obs"][1, 0][None]))[0]
    torch.testing.assert_close(part["final_value"][1, 0], expected)
    assert part["final_value"].shape == (steps, envs)

    # a streamed part runs no forward (a sharded model's is a collective): its values wait for `train`
    forwards = []
    ppo.model.get_value = lambda obs: forwards.append(obs) or torch.zeros(len(obs))
    ppo.train_part([trajectory])
    assert forwards == []
    ppo._with_values(ppo._parts[0])
    assert len(forwards) == 2  # the last observation's value, the cut episode's final one

    # a rank with fewer parts than another (simulators split unevenly over the ranks) runs as many forwards
    forwards.clear()
    ranks = SimpleNamespace(data_world=2, gather_data_ranks=lambda n: torch.stack([n, n + 2]), compute=nullcontext)
    ppo.backend = ranks
    ppo._match_forwards(ppo._parts)  # one part here, three on the other rank
    assert len(forwards) == 2 * 2


def test_a_ppo_update_that_goes_non_finite_stops_with_a_clear_error():
    from m2flow.context import WorkerContext, set_context
    from m2flow.errors import WorkerError
    from m2flow.workers.actor import PPO

    set_context(WorkerContext(worker="actor", kind="training", iterations=1))
    ppo = PPO(env_id="HalfCheetah-v5", hidden=[8], normalize_reward=False, minibatch_size=4, update_epochs=1)
    steps, envs = 4, 2
    trajectory = {
        "obs": np.zeros((steps, envs, 17), np.float32),
        "action": np.zeros((steps, envs, 6), np.float32),
        "logprob": np.zeros((steps, envs), np.float32),
        "value": np.zeros((steps, envs), np.float32),
        "reward": np.full((steps, envs), np.nan, np.float32),  # a simulator that sent NaN rewards
        "done": np.zeros((steps, envs), np.float32),
        "next_obs": np.zeros((envs, 17), np.float32),
        "next_done": np.zeros(envs, np.float32),
    }
    with pytest.raises(WorkerError, match="non-finite.*NaN or inf"):
        ppo.train([trajectory])


def test_grpo_groups_that_straddle_a_ranks_envs_stop_with_a_clear_error():
    from m2flow.context import WorkerContext, set_context
    from m2flow.errors import WorkerError
    from m2flow.workers.actor import PPO

    set_context(WorkerContext(worker="actor", kind="training", iterations=1))
    ppo = PPO(env_id="HalfCheetah-v5", hidden=[8], advantage="grpo", group_size=3, minibatch_size=4, update_epochs=1)
    env = gym_env()  # 2 envs: a group of 3 cannot sit whole in them
    env.obs()
    for _ in range(3):
        zeros = np.zeros(2, np.float32)
        env.step({"action": np.zeros((2, 6), np.float32), "logprob": zeros, "value": zeros})
    with pytest.raises(WorkerError, match="groups of 3 adjacent envs straddle.*multiple of group_size"):
        ppo.train([env.trajectory()])
