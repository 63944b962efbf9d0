"""Training backends: how a policy is sharded, how its full state is gathered and loaded.

A backend is picked by name (`workers.<name>.backend`) from a registry; the PPO logic calls only
this interface, so adding a backend never touches the algorithm.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch
from torch import nn

from m2flow.context import WorkerContext
from m2flow.errors import SpecError

_BACKENDS: dict[str, type[TrainingBackend]] = {}


def register_backend(cls: type[TrainingBackend]) -> type[TrainingBackend]:
    _BACKENDS[cls.name] = cls
    return cls


def get_backend(ctx: WorkerContext) -> TrainingBackend:
    name = ctx.backend or "fsdp"
    if name not in _BACKENDS:
        raise SpecError(
            [f"workers.{ctx.worker}.backend: unknown backend '{name}' (known: {', '.join(sorted(_BACKENDS))})"]
        )
    return _BACKENDS[name](ctx)


class TrainingBackend(ABC):
    name: ClassVar[str]

    def __init__(self, ctx: WorkerContext):
        self.ctx = ctx
        self.rank, self.world_size = ctx.rank, ctx.world_size
        self.data_rank, self.data_world = ctx.rank, ctx.world_size  # how minibatches are split over ranks

    @abstractmethod
    def wrap(self, model: nn.Module) -> nn.Module:
        """Shard or replicate `model` over the worker's ranks."""

    @abstractmethod
    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The whole model on CPU, on every rank (a collective)."""

    @abstractmethod
    def load_full_state_dict(self, model: nn.Module, state: dict[str, torch.Tensor]) -> None: ...

    @abstractmethod
    def optimizer_state_dict(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict: ...

    @abstractmethod
    def load_optimizer_state_dict(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None: ...

    def clip_grad_norm(self, model: nn.Module, max_norm: float) -> torch.Tensor:
        norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    def mean_across_ranks(self, values: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return values
        import torch.distributed as dist

        values = values.clone()
        dist.all_reduce(values)
        return values / self.world_size


@register_backend
class FSDPBackend(TrainingBackend):
    """FSDP2 (`fully_shard`): each child module, then the root, sharded over one mesh dimension."""

    name = "fsdp"

    def wrap(self, model: nn.Module) -> nn.Module:
        if self.world_size == 1:
            return model
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(self.ctx.device.split(":")[0], (self.world_size,))
        fully_shard(model, mesh=mesh)
        return model

    def _options(self):
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(full_state_dict=True)

    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        state = get_model_state_dict(model, options=self._options())
        return {k: v.detach().cpu().clone() for k, v in state.items()}

    def load_full_state_dict(self, model: nn.Module, state: dict[str, torch.Tensor]) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(model, state, options=self._options())

    def optimizer_state_dict(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(model, optimizer, options=self._options())

    def load_optimizer_state_dict(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        set_optimizer_state_dict(model, optimizer, state, options=self._options())
