"""The planner's analytic state size of each built-in model equals what the built torch model holds, for the
policies the configs use and every ViT preset (the real model built on the meta device: nothing allocated)."""

from __future__ import annotations

import pytest
import torch

from m2flow.workers.models import PolicyArgs, state_size
from m2flow.workers.models.vit_presets import VIT_SIZES

HALF_CHEETAH_VIEW = {"cameras": ["track"], "modalities": ["rgb", "proprio"], "size": (84, 84)}
VIT_VIEW = {**HALF_CHEETAH_VIEW, "size": (64, 64)}  # patches of 8 tile it
POLICIES = {
    "ppo_mujoco mlp": {"env_id": "HalfCheetah-v5", "hidden": [256, 256], "activation": "relu", "ortho_init": False},
    "mlp defaults, chunk 2": {"env_id": "HalfCheetah-v5", "chunk": 2},
    "ppo_camera cnn": {"env_id": "HalfCheetah-v5", "model": "cnn", "hidden": [256], "observation": HALF_CHEETAH_VIEW},
    "ppo_mujoco_camera cnn": {
        "env_id": "HalfCheetah-v5",
        "model": "cnn",
        "hidden": [256, 256],
        "activation": "relu",
        "log_std_init": -2.0,
        "observation": HALF_CHEETAH_VIEW,
    },
    "ppo_metaworld_camera cnn": {
        "env_id": "Meta-World/MT1",
        "env_kwargs": {"env_name": "reach-v3"},
        "model": "cnn",
        "hidden": [256],
        "chunk": 2,
        "observation": {"cameras": ["corner"], "modalities": ["rgb", "proprio"], "size": (64, 64)},
    },
    "sac_mujoco squashed": {"env_id": "HalfCheetah-v5", "model": "squashed", "hidden": [256, 256]},
    "sac_camera squashed": {
        "env_id": "HalfCheetah-v5",
        "model": "squashed",
        "hidden": [256, 256],
        "observation": {"cameras": ["track"], "modalities": ["rgb"], "size": (84, 84)},
    },
    **{
        f"vit {size}": {"env_id": "HalfCheetah-v5", "model": "vit", "size": size, "observation": VIT_VIEW}
        for size in VIT_SIZES
    },
    "vit causal, no proprio": {
        "env_id": "HalfCheetah-v5",
        "model": "vit",
        "causal": True,
        "patch": 4,
        "observation": {"cameras": ["track"], "modalities": ["rgb"], "size": (32, 32)},
    },
}


@pytest.mark.parametrize("name", POLICIES)
def test_analytic_state_size_equals_the_built_models(name):
    args = PolicyArgs(**POLICIES[name])
    with torch.device("meta"):
        model = args.build()
    parameters = sum(p.numel() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    size = state_size(args)
    assert size.trainable == parameters
    assert size.trainable_bytes == sum(p.numel() * p.element_size() for p in model.parameters())
    assert size.bytes == size.trainable_bytes + buffers
