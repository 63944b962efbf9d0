"""Weight sync: versioned, and the inference worker refuses stale or torn updates, keeping its model."""

from __future__ import annotations

import pytest
import torch

from m2flow.errors import WorkerError
from m2flow.workers.actor import PPO
from m2flow.workers.rollout import TorchPolicy

ARGS = {"env_id": "InvertedPendulum-v5", "hidden": [16, 16]}


@pytest.fixture
def pair():
    return PPO(**ARGS), TorchPolicy(**ARGS)


def test_fresh_weights_load_and_set_the_version(pair):
    actor, policy = pair
    actor.version = 3
    assert policy.load_weights(actor.weights()) == 3
    for key, value in actor.weights()["state"].items():
        torch.testing.assert_close(policy.model.state_dict()[key], value)


def test_one_rank_s_weights_are_copies_of_what_torch_s_full_state_dict_gathers(pair):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    actor, _ = pair
    gathered = get_model_state_dict(actor.model, options=StateDictOptions(full_state_dict=True))
    state = actor.backend.full_state_dict(actor.model)  # one rank, not sharded: the module's own state
    assert list(state) == list(gathered)
    own = {t.data_ptr() for t in actor.model.state_dict().values()}
    for key, value in state.items():
        assert torch.equal(value, gathered[key]) and value.data_ptr() not in own  # equal values, a copy


def test_stale_weights_are_refused(pair):
    actor, policy = pair
    actor.version = 5
    policy.load_weights(actor.weights())
    actor.version = 4
    with pytest.raises(WorkerError, match="stale weights version 4, already at 5"):
        policy.load_weights(actor.weights())


def test_a_half_written_update_is_refused_and_the_old_model_kept(pair):
    actor, policy = pair
    actor.version = 1
    policy.load_weights(actor.weights())
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    update = actor.weights()
    update["version"] = 2
    weight = update["state"]["actor_mean.0.weight"]
    half = weight.numel() // 2
    weight.view(-1)[:half] = torch.randn(half)  # the copy was cut off halfway through a newer write
    with pytest.raises(WorkerError, match="torn weights v2: contents do not match their checksum"):
        policy.load_weights(update)
    assert policy.version == 1
    for key, value in policy.model.state_dict().items():
        torch.testing.assert_close(value, before[key])


def test_an_incomplete_update_is_refused(pair):
    actor, policy = pair
    update = actor.weights()
    del update["state"]["critic.2.bias"]
    with pytest.raises(WorkerError, match=r"torn weights v0: missing \['critic.2.bias'\]"):
        policy.load_weights(update)


def test_memory_estimates_come_from_the_meta_device_and_scale_with_the_model():
    small = TorchPolicy.memory_estimate_gb(TorchPolicy.Config(**ARGS), 64)
    large = TorchPolicy.memory_estimate_gb(TorchPolicy.Config(**{**ARGS, "hidden": [1024, 1024]}), 64)
    assert 0 < small < large
    # each MLP (actor mean, critic) has one 1024x1024 layer of float32 that dominates: ~8.4 MB in all
    assert large * 2**30 == pytest.approx(2 * 1024 * 1024 * 4, rel=0.05)
    assert PPO.memory_estimate_gb(PPO.Config(**ARGS), 2048) == pytest.approx(4 * small, rel=0.01)  # no stacks
