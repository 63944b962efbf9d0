"""Off-policy pieces without Ray: decoupled PPO on stale samples, the replay buffer, SAC's update."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from m2flow.context import WorkerContext, set_context
from m2flow.errors import WorkerError
from m2flow.workers.algorithms import PPOLossConfig, ppo_loss
from m2flow.workers.buffer import ReplayBuffer, transitions
from tests.batches import pendulum_minibatches


def test_decoupled_ppo_weighs_each_sample_s_clipped_objective_and_unit_weights_are_plain_ppo():
    cfg = PPOLossConfig(clip_coef=0.2, ent_coef=0.0, vf_coef=0.5, clip_vloss=False)
    new, old = torch.log(torch.tensor([1.5, 0.5])), torch.zeros(2)
    args = (torch.zeros(2), torch.zeros(2), old, torch.tensor([1.0, -1.0]), torch.zeros(2), torch.zeros(2), cfg)
    _, plain = ppo_loss(new, *args)
    _, unit = ppo_loss(new, *args, torch.ones(2))
    _, weighted = ppo_loss(new, *args, torch.tensor([2.0, 0.5]))
    assert float(unit["pg_loss"]) == float(plain["pg_loss"]) == pytest.approx(-0.2)
    assert float(weighted["pg_loss"]) == pytest.approx((2.0 * -1.2 + 0.5 * 0.8) / 2)  # per-sample terms -1.2, 0.8


def trajectory(steps: int = 4, envs: int = 2, version: int = 0) -> dict:
    rng = np.random.default_rng(0)
    return {
        "obs": rng.normal(size=(steps, envs, 17)).astype(np.float32),
        "action": rng.normal(size=(steps, envs, 6)).astype(np.float32),
        "logprob": np.full((steps, envs), -30.0, np.float32),
        "value": np.zeros((steps, envs), np.float32),
        "reward": rng.normal(size=(steps, envs)).astype(np.float32),
        "done": np.zeros((steps, envs), np.float32),
        "next_obs": rng.normal(size=(envs, 17)).astype(np.float32),
        "next_done": np.zeros(envs, np.float32),
        "policy_version": np.full((steps, envs), version, np.int64),
    }


@pytest.mark.parametrize(("off_policy", "weighted"), [("decoupled", True), ("ratio", False)])
def test_ppo_measures_each_sample_s_staleness_and_corrects_stale_ones(off_policy, weighted):
    from m2flow.workers.actor import PPO

    set_context(WorkerContext(worker="actor", kind="training", iterations=2))
    ppo = PPO(env_id="HalfCheetah-v5", hidden=[8], minibatch_size=4, update_epochs=1, off_policy=off_policy)
    fresh = ppo.train([trajectory(version=0)])
    assert (fresh["actor/staleness_max"], fresh["actor/staleness_mean"]) == (0.0, 0.0)
    assert "actor/behavior_weight_mean" not in fresh
    stale = ppo.train([trajectory(version=0)])  # acted on by version 0, trained at version 1
    assert (stale["actor/staleness_max"], stale["actor/staleness_mean"]) == (1.0, 1.0)
    assert ("actor/behavior_weight_mean" in stale) == weighted
    if weighted:  # behaviour log-prob -30 is far below the policy's: every weight hits the cap
        assert stale["actor/behavior_weight_mean"] == pytest.approx(ppo.cfg.behavior_weight_cap)


def test_transitions_take_the_next_observation_the_final_one_at_a_time_limit_and_mask_real_endings():
    obs = np.arange(3 * 1 * 2, dtype=np.float32).reshape(3, 1, 2)  # steps 0..2 of one env
    final = np.zeros_like(obs)
    final[1, 0] = [-1, -1]  # step 1 hit the time limit: its next state is this final observation
    batch = transitions(
        {
            "obs": obs,
            "action": np.zeros((3, 1, 1), np.float32),
            "reward": np.array([[1.0], [2.0], [3.0]], np.float32),
            "done": np.array([[0.0], [0.0], [1.0]], np.float32),  # step 2 begins an episode
            "truncated": np.array([[0.0], [1.0], [0.0]], np.float32),
            "final_obs": final,
            "next_obs": np.array([[9.0, 9.0]], np.float32),
            "next_done": np.array([1.0], np.float32),  # step 2's episode really ended
        }
    )
    assert batch["next_obs"].tolist() == [[2, 3], [-1, -1], [9, 9]]
    assert batch["terminal"].tolist() == [0.0, 0.0, 1.0]  # a time limit is not an ending: bootstrap from it
    assert batch["reward"].tolist() == [1.0, 2.0, 3.0]


def transitions_of(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A simulator's trajectory of 8 steps of 2 envs."""
    return {
        "obs": rng.normal(size=(8, 2, 3)).astype(np.float32),
        "action": rng.normal(size=(8, 2, 1)).astype(np.float32),
        "reward": rng.normal(size=(8, 2)).astype(np.float32),
        "done": np.zeros((8, 2), np.float32),
        "next_obs": rng.normal(size=(2, 3)).astype(np.float32),
        "next_done": np.zeros(2, np.float32),
    }


def filled_buffer(**args) -> ReplayBuffer:
    set_context(WorkerContext(worker="buffer", kind="buffer", seed=5))
    buffer = ReplayBuffer(capacity=50, batch_size=4, learning_starts=10, **args)
    rng = np.random.default_rng(1)
    for _ in range(4):  # 4 x 8 steps x 2 envs = 64 transitions into 50 slots: the ring wraps
        buffer.add([transitions_of(rng)])
    return buffer


def test_the_buffer_samples_updates_per_step_minibatches_once_it_holds_learning_starts():
    set_context(WorkerContext(worker="buffer", kind="buffer"))
    filling = ReplayBuffer(batch_size=4, learning_starts=100)
    filling.add([transitions_of(np.random.default_rng(0))])
    assert filling.sample()["index"].shape == (0, 4)  # 16 of the 100 it waits for
    buffer = filled_buffer(updates_per_step=0.25)
    assert buffer.size == 50 and buffer.position == 14
    batch = buffer.sample()
    assert batch["obs"].shape == (16, 4, 3) and batch["terminal"].shape == (16, 4)  # 64 steps x 0.25
    assert buffer.sample()["index"].shape == (0, 4)  # nothing added since


@pytest.mark.parametrize("sampling", ["uniform", "prioritized"])
def test_a_buffer_resumed_from_its_checkpoint_samples_exactly_what_the_uninterrupted_one_does(tmp_path, sampling):
    original = filled_buffer(sampling=sampling, updates_per_step=0.3)  # 64 x 0.3: 0.2 of a minibatch carried
    original.update_priorities([{"index": np.array([3, 7]), "priority": np.array([5.0, 0.1])}])
    original.save_checkpoint(str(tmp_path))
    resumed = ReplayBuffer(capacity=50, batch_size=4, learning_starts=10, sampling=sampling, updates_per_step=0.3)
    resumed.load_checkpoint(str(tmp_path))  # a fresh buffer: contents, ring position, owed updates, random stream
    for _ in range(2):  # sample, then add and sample again: the ring and the priorities go on alike
        a, b = original.sample(), resumed.sample()
        assert a.keys() == b.keys() and len(a["index"]) > 0
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
        more = transitions_of(np.random.default_rng(7))
        original.add([more])
        resumed.add([more])
    assert (original.position, original.owed) == (resumed.position, resumed.owed)
    bigger = ReplayBuffer(capacity=60, batch_size=4, sampling=sampling)
    with pytest.raises(WorkerError, match="capacity 50, this run's is 60"):
        bigger.load_checkpoint(str(tmp_path))


def test_a_buffer_sampled_before_any_add_names_the_edge_order():
    set_context(WorkerContext(worker="buffer", kind="buffer"))
    with pytest.raises(WorkerError, match=r"name `... -> buffer.add` before `buffer.sample -> ...`"):
        ReplayBuffer().sample()


def test_sac_trains_one_step_per_minibatch_and_hands_the_policy_to_inference():
    from m2flow.workers.actor import SAC
    from m2flow.workers.rollout import TorchPolicy

    set_context(WorkerContext(worker="actor", kind="training", seed=2))
    sac = SAC(env_id="Pendulum-v1", hidden=[16, 16])
    batch = pendulum_minibatches(3, 8)
    metrics = sac.train([batch])
    assert metrics["actor/updates"] == 3.0 and sac.updates == 3 and sac.version == 1
    assert sac.priorities()["priority"].shape == (3, 8)
    assert sac.train([{k: v[:0] for k, v in batch.items()}]) == {"actor/updates": 0.0}  # the buffer still fills
    set_context(WorkerContext(worker="rollout", kind="inference", seed=2))
    policy = TorchPolicy(env_id="Pendulum-v1", model="squashed", hidden=[16, 16])
    assert policy.load_weights(sac.weights()) == 1
    acted = policy.act({"obs": batch["obs"][0], "env_id": np.arange(8)})
    assert acted["action"].shape == (8, 1) and np.abs(acted["action"]).max() <= 2.0  # Pendulum's bounds


def test_a_sharded_buffer_draws_each_shard_s_share_of_every_minibatch_with_global_indices():
    from m2flow.workers.actor import SAC

    shards = []
    for replica in range(2):
        set_context(WorkerContext(worker="buffer", kind="buffer", replica=replica, replicas=2, seed=5))
        shard = ReplayBuffer(capacity=50, batch_size=6, learning_starts=10, sampling="prioritized")
        shard.add([transitions_of(np.random.default_rng(replica))])  # 16 steps each, its own simulator's
        shards.append(shard)
    assert [(s.capacity, s.batch_size, s.learning_starts) for s in shards] == [(25, 3, 5)] * 2
    samples = [s.sample() for s in shards]
    assert [m["obs"].shape for m in samples] == [(32, 3, 3)] * 2  # one update per env step of both
    assert samples[0]["index"].max() < 25 <= samples[1]["index"].min()
    # SAC's minibatch is the shards' shares side by side; its priorities go back to every shard, each keeps its own
    set_context(WorkerContext(worker="actor", kind="training", seed=2))
    sac = SAC(env_id="Pendulum-v1", hidden=[16, 16])
    assert sac.train(samples)["actor/updates"] == 32.0
    assert sac.priorities()["index"].shape == (32, 6)
    for shard in shards:
        shard.update_priorities([sac.priorities()])
    sampled = [np.unique(m["index"]) for m in samples]
    assert np.all(shards[0].priorities[sampled[0]] != 1.0) and np.all(shards[1].priorities[sampled[1] - 25] != 1.0)
    unequal = {k: v[:3] for k, v in samples[1].items()}
    with pytest.raises(WorkerError, match=r"the replay buffer's shards sampled \[32, 3\] minibatches"):
        sac.train([samples[0], unequal])


def test_sac_from_pixels_trains_the_critic_s_cnn_the_policy_reads_on_uint8_frames_with_cut_episodes_final_frame():
    from m2flow.workers.actor import SAC
    from m2flow.workers.env import CameraEnv
    from m2flow.workers.rollout import TorchPolicy

    view = {"cameras": ["track"], "modalities": ["rgb", "proprio"], "size": [36, 36]}
    policy = {"env_id": "HalfCheetah-v5", "model": "squashed", "hidden": [32, 32], "observation": view}
    set_context(WorkerContext(worker="env", kind="simulator", items=(0, 2), seed=3))
    env = CameraEnv(
        env_id="HalfCheetah-v5", num_envs=2, observation=view, bootstrap_time_limits=True,
        env_kwargs={"max_episode_steps": 5},
    )  # fmt: skip
    rng = np.random.default_rng(0)
    env.obs()
    for _ in range(8):
        env.step({"action": rng.uniform(-1, 1, size=(2, 6)).astype(np.float32)})
    trajectory = env.trajectory()
    assert trajectory["truncated"][:, 0].tolist() == [0, 0, 0, 0, 1, 0, 0, 0]  # step 5 of 5: a time limit
    batch = transitions(trajectory)
    final_rgb = trajectory["final_obs"]["rgb"][4]
    assert batch["obs"]["rgb"].dtype == np.uint8 and final_rgb.any()
    np.testing.assert_array_equal(batch["next_obs"]["rgb"][4 * 2 : 4 * 2 + 2], final_rgb)  # not the reset frame
    assert batch["terminal"].sum() == 0 and "env_id" not in batch["obs"]
    with pytest.raises(WorkerError, match="set bootstrap_time_limits: true"):
        transitions({k: v for k, v in trajectory.items() if k not in ("truncated", "final_obs")})

    set_context(WorkerContext(worker="buffer", kind="buffer", seed=5))
    buffer = ReplayBuffer(capacity=100, batch_size=4, learning_starts=8, updates_per_step=0.25)
    buffer.add([trajectory])
    sample = buffer.sample()
    assert sample["obs"]["rgb"].shape == (4, 4, 1, 36, 36, 3) and sample["obs"]["rgb"].dtype == np.uint8
    set_context(WorkerContext(worker="actor", kind="training", seed=2))
    sac = SAC(**policy)
    assert sac.actor.encoder is sac.critic.encoder  # DrQ: one CNN, trained by the critic loss
    before = {k: v.clone() for k, v in sac.critic.encoder.state_dict().items()}
    metrics = sac.train([sample])
    assert metrics["actor/updates"] == 4.0 and np.isfinite(metrics["actor/q_loss"])
    assert any(not torch.equal(before[k], v) for k, v in sac.critic.encoder.state_dict().items())  # the CNN learns
    assert {k for k in sac.weights()["state"] if k.startswith("encoder.")}  # the policy sent to acting includes it
    set_context(WorkerContext(worker="rollout", kind="inference", seed=2))
    acting = TorchPolicy(**policy)
    assert acting.load_weights(sac.weights()) == 1
    acted = acting.act(env.obs())
    assert acted["action"].shape == (2, 6) and np.abs(acted["action"]).max() <= 1.0
