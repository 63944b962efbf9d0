"""The registry of models: how each `PolicyArgs.model` is built (torch), and the observation encoder."""

from __future__ import annotations

import numpy as np
from torch import nn

from m2flow.workers.models.cnn import CNNPolicy
from m2flow.workers.models.encoders import PixelEncoder, StateEncoder
from m2flow.workers.models.hf import HFPolicy
from m2flow.workers.models.mlp import GaussianMLP, PolicyConfig
from m2flow.workers.models.policy_args import PolicyArgs, camera_inputs
from m2flow.workers.models.squashed import SquashedGaussian
from m2flow.workers.models.vit import ViTPolicy
from m2flow.workers.models.vit_presets import vit_shape


def _mlp(args: PolicyArgs) -> nn.Module:
    obs_dim, act_dim = args.dims()
    config = PolicyConfig(obs_dim=obs_dim, act_dim=act_dim * args.chunk, hidden=args.hidden, **_heads(args))
    return GaussianMLP(config)


def _cnn(args: PolicyArgs) -> nn.Module:
    return CNNPolicy(camera_inputs(args), args.hidden, **_heads(args))


def _heads(args: PolicyArgs) -> dict:
    """The heads' settings the args give (a `log_std_init` left out keeps the model's own default)."""
    heads = {"activation": args.activation, "ortho_init": args.ortho_init}
    return heads if args.log_std_init is None else {**heads, "log_std_init": args.log_std_init}


def _vit(args: PolicyArgs) -> nn.Module:
    width, depth, heads = vit_shape(args.size, args.width, args.depth, args.heads)
    return ViTPolicy(camera_inputs(args), width, depth, heads, args.patch, args.causal)


def _hf(args: PolicyArgs) -> nn.Module:
    return HFPolicy(camera_inputs(args), args.hf)


def observation_encoder(args: PolicyArgs) -> nn.Module:
    """What a network built from these args sees of an observation: the state as it is, or, given a camera
    `observation`, its images through a CNN projected to `hidden[0]` (proprioception joined after)."""
    if args.observation is None:
        obs_dim, _ = args.dims()
        return StateEncoder(obs_dim)
    return PixelEncoder(camera_inputs(args), args.hidden[0])


def _squashed(args: PolicyArgs) -> nn.Module:
    import torch

    from m2flow.workers.env.env_ids import make_env

    env = make_env(args.env_id, **args.env_kwargs)
    try:
        space = env.action_space
        low, high = torch.tensor(space.low, dtype=torch.float32), torch.tensor(space.high, dtype=torch.float32)
    finally:
        env.close()
    act_dim = int(np.prod(space.shape))
    return SquashedGaussian(observation_encoder(args), act_dim, args.hidden, low.flatten(), high.flatten())


MODELS = {"mlp": _mlp, "cnn": _cnn, "vit": _vit, "hf": _hf, "squashed": _squashed}
