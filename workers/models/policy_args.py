"""The policy both inference and training workers build (`PolicyArgs`): its typed args and the sizes read
from them (camera inputs, transformer stacks). No torch here: the planner reads these; `build()` imports
the model's code."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_validator

import m2flow
from m2flow.workers.env.env_ids import registered
from m2flow.workers.env.observation import CameraObservation
from m2flow.workers.env.spaces import env_dims
from m2flow.workers.models.activations import Stack
from m2flow.workers.models.hf_folder import hf_stacks
from m2flow.workers.models.hf_options import HFOptions, check_exported_actions, exported_settings
from m2flow.workers.models.inputs import VisionInputs
from m2flow.workers.models.vit_presets import VIT_SIZES, vit_shape, vit_tokens

if TYPE_CHECKING:
    from torch import nn


# by model, the fields that shape its weights (an hf model's are its checkpoint's)
ARCHITECTURE: dict[str, tuple[str, ...]] = {
    "mlp": ("hidden", "activation"),
    "squashed": ("hidden",),  # its layers are ReLU whatever `activation` says
    "cnn": ("hidden", "activation"),
    "vit": ("width", "depth", "heads", "patch", "causal"),
    "hf": (),
}


class PolicyArgs(m2flow.WorkerConfig):
    """The policy both inference and training workers build (their `args` share these fields)."""

    # across the loop, the env it acts in (its sizes, the actions a call emits, the cameras it reads); across a sync,
    # that and the model whose weights move (its architecture: `agreeing`)
    agreeing_fields = {
        "loop": frozenset({"env_id", "chunk", "observation"}),
        "sync": frozenset({"env_id", "chunk", "observation", "model"}),
    }

    env_id: Annotated[str, AfterValidator(registered)] = Field(
        description="the gymnasium env the policy acts in: its observation and action sizes"
    )
    model: Literal["mlp", "cnn", "vit", "hf", "squashed"] = Field(
        "mlp",
        description="mlp: PPO's Gaussian actor-critic; squashed: SAC's tanh-Gaussian actor (on a state, or on"
        " cameras given an `observation`); cnn, vit, hf: cameras",
    )
    hidden: list[Annotated[int, Field(ge=1)]] = Field(
        default_factory=lambda: [64, 64],
        min_length=1,
        description="mlp, squashed: hidden-layer widths; cnn: the pixel encoder's features, then the heads' widths",
    )
    size: Literal[tuple(VIT_SIZES)] = Field("1m", description="vit: preset by parameter count")
    width: int | None = Field(None, ge=8, description="vit: overrides the preset's width")
    depth: int | None = Field(None, ge=1, description="vit: overrides the preset's number of blocks")
    heads: int | None = Field(None, ge=1, description="vit: overrides the preset's attention heads")
    patch: int = Field(8, ge=1, description="vit: patch side in pixels")
    causal: bool = Field(False, description="vit: causal attention (as a GPT trunk runs it)")
    activation: Literal["tanh", "relu"] = Field("tanh", description="mlp, cnn: hidden-layer activation")
    log_std_init: float | None = Field(
        None, description="mlp, cnn: the Gaussian's initial log standard deviation (default: mlp 0, cnn -0.5)"
    )
    ortho_init: bool = Field(
        True, description="mlp, cnn heads: orthogonal initialisation (CleanRL); false: PyTorch's default"
    )
    chunk: int = Field(1, ge=1, description="actions per call: the policy emits chunk x action size")
    observation: CameraObservation | None = Field(
        None, description="the camera observation (cnn, vit, hf; squashed from pixels)"
    )
    hf: HFOptions | None = Field(None, description="hf: the Hugging Face model (a local folder) and its action head")
    env_kwargs: dict[str, Any] = Field(default_factory=dict, description="passed to gymnasium.make for the sizes")

    def agreeing(self, phase: str, port: str) -> dict[str, m2flow.Agreed]:
        """Across a sync, also the fields that shape this model's weights, as built: a ViT's width, depth and heads
        as its preset gives them where not written (said at `size`)."""
        agreed = super().agreeing(phase, port)
        if phase == "sync":
            shape = vit_shape(self.size, self.width, self.depth, self.heads)
            resolved = dict(zip(("width", "depth", "heads"), shape, strict=True))
            for name in ARCHITECTURE[self.model]:
                key = "size" if name in resolved and getattr(self, name) is None else name
                agreed[name] = m2flow.Agreed(key, resolved.get(name, getattr(self, name)))
        return agreed

    @model_validator(mode="after")
    def _hf_has_its_options(self) -> PolicyArgs:
        if self.model == "hf":
            if self.hf is None or self.observation is None:
                raise ValueError(
                    "model: hf needs `hf: {path: <a local transformers checkpoint>}` and the camera `observation`"
                )
            if exported_settings(self.hf) is not None:  # sizing the actions may build the env: only when needed
                check_exported_actions(self.hf, camera_inputs(self).act_dim)
        return self

    def build(self) -> nn.Module:
        from m2flow.workers.models.policy import MODELS

        return MODELS[self.model](self)

    def dims(self) -> tuple[int, int]:
        """The task's observation (state or proprioception) and action sizes, one action per call."""
        return env_dims(self.env_id, **self.env_kwargs)

    def blocks(self) -> int:
        """Transformer blocks of the model (1 for models without)."""
        return max(1, sum(stack.layers for stack in self.stacks()))

    def stacks(self) -> list[Stack]:
        """The model's transformer stacks (none for MLP and CNN policies), for its activation memory."""
        shape = STACKS.get(self.model)
        return shape(self) if shape else []


def camera_inputs(args: PolicyArgs) -> VisionInputs:
    """What a camera policy built from `args` reads and emits."""
    if args.observation is None:
        raise ValueError(f"model: {args.model} needs an `observation` (cameras, modalities, size) like the simulator's")
    proprio_dim, act_dim = args.dims()
    view = args.observation
    proprio = proprio_dim if "proprio" in view.modalities else 0
    return VisionInputs(view.modalities, len(view.cameras), view.size, proprio, act_dim * args.chunk)


def _vit_stacks(args: PolicyArgs) -> list[Stack]:
    width, depth, _ = vit_shape(args.size, args.width, args.depth, args.heads)
    return [Stack(depth, vit_tokens(camera_inputs(args), args.patch), width, 4 * width, width)]


def _hf_stacks(args: PolicyArgs) -> list[Stack]:
    return hf_stacks(args.hf, camera_inputs(args).act_dim)


STACKS = {"vit": _vit_stacks, "hf": _hf_stacks}
