"""What inference and training workers need to build the same policy, and the registry of models."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import AfterValidator, Field, model_validator
from torch import nn

import m2flow
from m2flow.workers.env.camera_env import CameraObservation
from m2flow.workers.env.env_ids import registered
from m2flow.workers.models.activations import Stack
from m2flow.workers.models.cnn import CNNPolicy
from m2flow.workers.models.encoders import PixelEncoder, StateEncoder
from m2flow.workers.models.hf import HFOptions, HFPolicy, check_exported_actions, exported_settings, hf_stacks
from m2flow.workers.models.mlp import GaussianMLP, PolicyConfig, env_dims
from m2flow.workers.models.squashed import SquashedGaussian
from m2flow.workers.models.vision import VisionInputs
from m2flow.workers.models.vit import VIT_SIZES, ViTPolicy, vit_shape, vit_tokens


class PolicyArgs(m2flow.WorkerConfig):
    """The policy both inference and training workers build (their `args` share these fields)."""

    env_id: Annotated[str, AfterValidator(registered)]
    model: Literal["mlp", "cnn", "vit", "hf", "squashed"] = Field(
        "mlp",
        description="mlp: PPO's Gaussian actor-critic; squashed: SAC's tanh-Gaussian actor (on a state, or on"
        " cameras given an `observation`); cnn, vit, hf: cameras",
    )
    hidden: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [64, 64], min_length=1)
    size: Literal[tuple(VIT_SIZES)] = Field("1m", description="vit: preset by parameter count")
    width: int | None = Field(None, ge=8, description="vit: overrides the preset's width")
    depth: int | None = Field(None, ge=1, description="vit: overrides the preset's number of blocks")
    heads: int | None = Field(None, ge=1, description="vit: overrides the preset's attention heads")
    patch: int = Field(8, ge=1, description="vit: patch side in pixels")
    causal: bool = Field(False, description="vit: causal attention (as a GPT trunk runs it)")
    activation: Literal["tanh", "relu"] = Field("tanh", description="mlp: hidden-layer activation")
    log_std_init: float = Field(0.0, description="mlp: the Gaussian's initial log standard deviation")
    ortho_init: bool = Field(True, description="mlp: orthogonal initialisation (CleanRL); false: PyTorch's default")
    chunk: int = Field(1, ge=1, description="actions per call: the policy emits chunk x action size")
    observation: CameraObservation | None = Field(
        None, description="the camera observation (cnn, vit, hf; squashed from pixels)"
    )
    hf: HFOptions | None = Field(None, description="hf: the Hugging Face model (a local folder) and its action head")
    env_kwargs: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _hf_has_its_options(self) -> PolicyArgs:
        if self.model == "hf":
            if self.hf is None or self.observation is None:
                raise ValueError(
                    "model: hf needs `hf: {path: <a local transformers checkpoint>}` and the camera `observation`"
                )
            if exported_settings(self.hf) is not None:  # sizing the actions builds the env: only when needed
                check_exported_actions(self.hf, _camera_inputs(self).act_dim)
        return self

    def build(self) -> nn.Module:
        return MODELS[self.model](self)

    def blocks(self) -> int:
        """Transformer blocks of the model (1 for models without)."""
        return max(1, sum(stack.layers for stack in self.stacks()))

    def stacks(self) -> list[Stack]:
        """The model's transformer stacks (none for MLP and CNN policies), for its activation memory."""
        shape = STACKS.get(self.model)
        return shape(self) if shape else []


def _mlp(args: PolicyArgs) -> nn.Module:
    obs_dim, act_dim = env_dims(args.env_id, **args.env_kwargs)
    return GaussianMLP(
        PolicyConfig(
            obs_dim=obs_dim,
            act_dim=act_dim * args.chunk,
            hidden=args.hidden,
            activation=args.activation,
            log_std_init=args.log_std_init,
            ortho_init=args.ortho_init,
        )
    )


def _camera_inputs(args: PolicyArgs) -> VisionInputs:
    if args.observation is None:
        raise ValueError(f"model: {args.model} needs an `observation` (cameras, modalities, size) like the simulator's")
    proprio_dim, act_dim = env_dims(args.env_id, **args.env_kwargs)
    view = args.observation
    proprio = proprio_dim if "proprio" in view.modalities else 0
    return VisionInputs(view.modalities, len(view.cameras), view.size, proprio, act_dim * args.chunk)


def _cnn(args: PolicyArgs) -> nn.Module:
    return CNNPolicy(_camera_inputs(args), hidden=args.hidden[0])


def _vit(args: PolicyArgs) -> nn.Module:
    width, depth, heads = vit_shape(args.size, args.width, args.depth, args.heads)
    return ViTPolicy(_camera_inputs(args), width, depth, heads, args.patch, args.causal)


def _hf(args: PolicyArgs) -> nn.Module:
    return HFPolicy(_camera_inputs(args), args.hf)


def observation_encoder(args: PolicyArgs) -> nn.Module:
    """What a network built from these args sees of an observation: the state as it is, or, given a camera
    `observation`, its images through a CNN projected to `hidden[0]` (proprioception joined after)."""
    if args.observation is None:
        obs_dim, _ = env_dims(args.env_id, **args.env_kwargs)
        return StateEncoder(obs_dim)
    return PixelEncoder(_camera_inputs(args), args.hidden[0])


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


def _vit_stacks(args: PolicyArgs) -> list[Stack]:
    width, depth, _ = vit_shape(args.size, args.width, args.depth, args.heads)
    return [Stack(depth, vit_tokens(_camera_inputs(args), args.patch), width, 4 * width, width)]


def _hf_stacks(args: PolicyArgs) -> list[Stack]:
    return hf_stacks(args.hf, _camera_inputs(args).act_dim)


STACKS = {"vit": _vit_stacks, "hf": _hf_stacks}


@dataclass(frozen=True)
class StateSize:
    """A policy's state, sized on the meta device (nothing allocated)."""

    bytes: int  # parameters and buffers, in the dtypes they load in
    trainable: int  # how many parameters training changes (all, or with LoRA the adapters and heads)
    trainable_bytes: int  # those, in the dtypes they load in


def state_size(args: PolicyArgs) -> StateSize:
    import torch

    with torch.device("meta"):
        model = args.build()
    trainable = [p for p in model.parameters() if p.requires_grad]
    return StateSize(
        bytes=sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()]),
        trainable=sum(p.numel() for p in trainable),
        trainable_bytes=sum(p.numel() * p.element_size() for p in trainable),
    )


def state_bytes(args: PolicyArgs) -> int:
    """Bytes of the policy's parameters and buffers, sized on the meta device (nothing allocated)."""
    return state_size(args).bytes
