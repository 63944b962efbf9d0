"""What inference and training workers need to build the same policy, and the registry of models."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from m2flow.workers.env.camera_env import CameraObservation
from m2flow.workers.models.cnn import CNNPolicy
from m2flow.workers.models.mlp import GaussianMLP, PolicyConfig, env_dims


class PolicyArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    env_id: str
    model: Literal["mlp", "cnn"] = "mlp"
    hidden: list[int] = Field(default_factory=lambda: [64, 64])
    normalize_obs: bool = True
    chunk: int = Field(1, ge=1, description="actions per call: the policy emits chunk x action size")
    observation: CameraObservation | None = Field(None, description="the camera observation (cnn model)")
    env_kwargs: dict[str, Any] = Field(default_factory=dict)

    def build(self) -> nn.Module:
        return MODELS[self.model](self)


def _mlp(args: PolicyArgs) -> nn.Module:
    obs_dim, act_dim = env_dims(args.env_id, **args.env_kwargs)
    return GaussianMLP(
        PolicyConfig(
            obs_dim=obs_dim, act_dim=act_dim * args.chunk, hidden=args.hidden, normalize_obs=args.normalize_obs
        )
    )


def _cnn(args: PolicyArgs) -> nn.Module:
    if args.observation is None:
        raise ValueError("model: cnn needs an `observation` (cameras, modalities, size) like the simulator's")
    proprio_dim, act_dim = env_dims(args.env_id, **args.env_kwargs)
    view = args.observation
    return CNNPolicy(
        view.modalities,
        len(view.cameras),
        view.size,
        proprio_dim if "proprio" in view.modalities else 0,
        act_dim * args.chunk,
        hidden=args.hidden[0],
    )


MODELS = {"mlp": _mlp, "cnn": _cnn}


def state_bytes(args: PolicyArgs) -> int:
    """Bytes of the policy's parameters and buffers, sized on the meta device (nothing allocated)."""
    import torch

    with torch.device("meta"):
        model = args.build()
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
