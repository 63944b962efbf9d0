"""Training backends: how a policy is sharded, how its state is gathered, saved and reloaded.

A backend is picked by name (`workers.<name>.backend`) from a registry; the PPO logic calls only
this interface, so adding a backend never touches the algorithm.

Two views of the state exist:
- the *full* state dict (plain layout, whole tensors on CPU) for weight sync to inference workers;
- the *sharded* state (plain layout's names, each rank holding its shards as DTensors) for
  `torch.distributed.checkpoint`: every rank writes its own shards, and a checkpoint reloads at any
  world size and under either backend, because both describe their state in the same names.
"""

from __future__ import annotations

import contextlib
import importlib
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import ConfigDict, Field

from m2flow.context import WorkerContext
from m2flow.errors import SpecError
from m2flow.strict_numbers import NumbersNotBooleans
from m2flow.workers.models.precision import Precision, compute_in

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.distributed.device_mesh import DeviceMesh

_BACKENDS: dict[str, type[TrainingBackend]] = {}
BUILT_IN = {"megatron": "m2flow.workers.actor.megatron_backend"}  # registered on import, when first asked for


class BackendOptions(NumbersNotBooleans):
    """How a training backend runs the policy (workers.<name>.args of a training worker)."""

    model_config = ConfigDict(extra="forbid")

    precision: Precision = Field("fp32", description="compute dtype: bf16 autocast over fp32 master weights, or fp32")
    activation_checkpointing: bool = Field(
        False, description="recompute each block's activations in the backward (models with blocks: vit, hf)"
    )
    cpu_offload: bool = Field(False, description="CUDA: parameters and optimizer state on the host between uses")


def register_backend(cls: type[TrainingBackend]) -> type[TrainingBackend]:
    _BACKENDS[cls.name] = cls
    return cls


def backend_class(name: str | None) -> type[TrainingBackend]:
    """The registered backend `name` (default fsdp); ValueError naming the known ones otherwise."""
    name = name or "fsdp"
    if name not in _BACKENDS and name in BUILT_IN:
        importlib.import_module(BUILT_IN[name])
    if name not in _BACKENDS:
        raise ValueError(f"unknown backend '{name}' (known: {', '.join(sorted({*_BACKENDS, *BUILT_IN}))})")
    return _BACKENDS[name]


def get_backend(ctx: WorkerContext, options: BackendOptions | None = None) -> TrainingBackend:
    try:
        cls = backend_class(ctx.backend)
    except ValueError as exc:
        raise SpecError([f"workers.{ctx.worker}.backend: {exc}"]) from None
    return cls(ctx, options or BackendOptions())


class TrainingBackend(ABC):
    name: ClassVar[str]

    def __init__(self, ctx: WorkerContext, options: BackendOptions):
        import torch

        self.ctx, self.options = ctx, options
        self.rank, self.world_size = ctx.rank, ctx.world_size
        self.data_world = self.data_parallel_size(ctx.world_size)  # ranks holding distinct data
        self.data_rank = ctx.rank * self.data_world // ctx.world_size
        self.device = torch.device(ctx.device)

    @classmethod
    def data_parallel_size(cls, world_size: int) -> int:
        """How many of `world_size` ranks hold distinct data (the rest share theirs: model parallelism)."""
        return world_size

    def wrap(self, model: nn.Module) -> nn.Module:
        """Shard or replicate `model` over the worker's ranks, with the options applied."""
        if self.options.activation_checkpointing:
            if not hasattr(model, "activation_checkpointing"):
                raise SpecError(
                    [
                        f"workers.{self.ctx.worker}.args.activation_checkpointing: the model"
                        f" {type(model).__name__} has no transformer blocks to checkpoint (use model: vit)"
                    ]
                )
            model.activation_checkpointing = True
        return self._wrap(model)

    @abstractmethod
    def _wrap(self, model: nn.Module) -> nn.Module: ...

    def compute(self) -> contextlib.AbstractContextManager:
        """The forward/backward context: bf16 autocast when asked (master weights stay fp32)."""
        return compute_in(self.device, self.options.precision)

    @abstractmethod
    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The whole model on the training device, a copy on every rank (a collective): the sync edge's
        transport moves it device to device, or through the host."""

    @abstractmethod
    def sharded_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """{"model": ..., "optimizer": ...} in the plain layout's names; shards as DTensors."""

    @abstractmethod
    def load_sharded_state(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """Apply a state that `torch.distributed.checkpoint.load` filled in (same structure as `sharded_state`)."""

    def ensure_process_group(self) -> None:
        """Multi-rank workers get their group from the runtime; a single rank that needs one (sharding,
        Megatron's parallel state) gets a group of one: NCCL for CUDA tensors plus gloo for CPU ones."""
        import torch.distributed as dist

        if not dist.is_initialized():
            backend = "cpu:gloo,cuda:nccl" if self.device.type == "cuda" else "gloo"
            dist.init_process_group(
                backend, store=dist.HashStore(), rank=0, world_size=1, timeout=self.ctx.collective_timeout
            )

    def world_mesh(self) -> DeviceMesh:
        """A 1-D device mesh over the worker's ranks, on its default process group: collectives on the mesh
        run under the plan's deadline (`init_device_mesh` would make a group of its own, with torch's default
        timeout, for a CPU rank where CUDA is visible)."""
        import torch.distributed as dist
        from torch.distributed.device_mesh import DeviceMesh

        self.ensure_process_group()
        return DeviceMesh.from_group(dist.group.WORLD, self.device.type)

    def clip_grad_norm(self, model: nn.Module, max_norm: float) -> torch.Tensor:
        from torch import nn

        norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    def gather_data_ranks(self, values: torch.Tensor) -> torch.Tensor:
        """`values` of every data-parallel rank stacked in rank order: [data_world, ...] (a collective on
        the backend's device; the result on `values`' device)."""
        import torch

        if self.data_world == 1:
            return values[None]
        import torch.distributed as dist

        local = values.to(self.device).contiguous()
        out = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(out, local)
        return torch.stack(out).to(values.device)  # data-parallel backends: every rank is its own data rank

    def sum_data_ranks(self, values: torch.Tensor) -> torch.Tensor:
        return self.gather_data_ranks(values).sum(0) if self.data_world > 1 else values

    def mean_across_ranks(self, values: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return values
        import torch.distributed as dist

        summed = values.to(self.device, copy=True)
        dist.all_reduce(summed)
        return (summed / self.world_size).to(values.device)


@register_backend
class FSDPBackend(TrainingBackend):
    """FSDP2 (`fully_shard`): each transformer block (if any), then the root, sharded over one mesh
    dimension; bf16 parameters in compute with fp32 gradient reduction; parameters and optimizer
    state on the host between uses with `cpu_offload` (CUDA). What trains is held as fp32 master weights
    however it was loaded; a model left in mixed dtypes (a frozen bf16 base under fp32 adapters) is sharded
    all in fp32, as FSDP2 shards groups of one dtype. `precision` alone decides the compute dtype, on one
    rank as on several."""

    name = "fsdp"

    def _wrap(self, model: nn.Module) -> nn.Module:
        import torch

        for p in model.parameters():  # what trains keeps fp32 master weights, whatever dtype it loaded in
            if p.requires_grad and p.is_floating_point() and p.dtype != torch.float32:
                p.data = p.data.float()
        offload = self.options.cpu_offload and self.device.type == "cuda"
        if self.world_size == 1 and not offload:
            return model
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

        mesh = self.world_mesh()  # one rank, sharded only to offload: a process group of one
        loaded = {p.dtype for p in model.parameters()}
        if len(loaded) > 1:
            model.float()
        bf16 = self.options.precision == "bf16"
        kwargs = {
            "mesh": mesh,
            "offload_policy": CPUOffloadPolicy() if offload else OffloadPolicy(),
            "mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else None, reduce_dtype=torch.float32),
        }
        for block in getattr(model, "blocks", []):
            fully_shard(block, **kwargs)
        fully_shard(model, **kwargs)
        return model

    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        from torch.distributed.fsdp import FSDPModule

        if isinstance(model, FSDPModule):  # gathered from the shards
            state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
        else:  # one rank, not sharded (`_wrap`): the module's own tensors, without the per-tensor bookkeeping
            state = model.state_dict()
        return {k: v.detach().clone() for k, v in state.items()}

    def sharded_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        options = StateDictOptions(ignore_frozen_params=True)  # frozen weights (a LoRA base) come from their folder
        model_state, optimizer_state = get_state_dict(model, optimizer, options=options)
        return {"model": model_state, "optimizer": optimizer_state}

    def load_sharded_state(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        set_state_dict(
            model,
            optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
            # not strict: dcp.load filled every trained model key already (its template holds them all); what
            # may lack here is the optimizer state of parameters that never had a gradient, and frozen weights
            options=StateDictOptions(ignore_frozen_params=True, strict=False),
        )
