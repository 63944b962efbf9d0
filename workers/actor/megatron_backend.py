"""Megatron-core backend: tensor parallelism over all of the worker's ranks (TP = ranks, one data replica).

- MLP policies: each `nn.Sequential` of `Linear` and element-wise layers becomes pairs of column- and
  row-parallel layers of megatron-core.
- ViT policies (CUDA): the transformer trunk runs on megatron-core's GPTModel (`megatron_gpt.py`).

Layers start from the plain model's weights, so a TP=2 group computes what one rank computes; every rank
sees the whole minibatch. Every tensor of the state is described in the plain model's layout (an `Entry`:
its plain name, the dim its TP shards split, the q/k/v reordering if any), so full state dicts (weight
sync) gather into the layout inference workers run, and checkpoints hold shards named in that layout
(DTensors, written by each rank) or whole tensors where the layouts differ by more than a split: a
checkpoint reloads at another TP size or under the FSDP backend. CPU/gloo and CUDA/NCCL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from m2flow.errors import MissingDependency, SpecError
from m2flow.workers.actor.backends import TrainingBackend, register_backend
from m2flow.workers.actor.megatron_gpt import GPTTrunkPolicy, qkv_from_megatron, qkv_to_megatron
from m2flow.workers.models.vit import ViTPolicy


class _Sharded(nn.Module):
    """A megatron parallel linear that returns only its output; remembers how it splits the full weight."""

    def __init__(self, layer: nn.Module, split_dim: int, bias_split: bool):
        super().__init__()
        self.layer, self.split_dim, self.bias_split = layer, split_dim, bias_split

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, bias = self.layer(x)
        return out if bias is None else out + bias


@dataclass(frozen=True)
class Entry:
    """One tensor of the model's state, seen from the plain layout."""

    plain: str
    tensor: torch.Tensor  # this rank's parameter or buffer
    dim: int | None = None  # split over TP ranks on this dim; None: every rank holds it whole
    heads: int | None = None  # fused q/k/v rows in Megatron's per-head order


@register_backend
class MegatronBackend(TrainingBackend):
    name = "megatron"

    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        self.mesh = None

    @classmethod
    def data_parallel_size(cls, world_size: int) -> int:
        return 1  # tensor parallel: every rank works on the same samples

    def _wrap(self, model: nn.Module) -> nn.Module:
        if isinstance(model, ViTPolicy):
            return self._gpt(model)
        if self.world_size == 1:
            return model
        self._initialize()
        from megatron.core.model_parallel_config import ModelParallelConfig

        config = ModelParallelConfig(
            tensor_model_parallel_size=self.world_size, use_cpu_initialization=True, params_dtype=torch.float32
        )
        for name, child in model.named_children():
            if isinstance(child, nn.Sequential) and any(isinstance(m, nn.Linear) for m in child):
                setattr(model, name, self._parallel(child, config))
        return model.to(self.device)  # the parallel layers are built on the host (use_cpu_initialization)

    def _gpt(self, model: ViTPolicy) -> nn.Module:
        if self.device.type != "cuda":
            raise SpecError(
                [
                    f"workers.{self.ctx.worker}.backend: megatron runs a vit policy on megatron-core's GPTModel,"
                    " which needs CUDA; on CPU use backend: fsdp (or an mlp policy)"
                ]
            )
        self._initialize()
        from megatron.core import tensor_parallel

        tensor_parallel.model_parallel_cuda_manual_seed(self.ctx.seed)
        return GPTTrunkPolicy(model, self.rank, self.world_size, self.options.activation_checkpointing)

    def _initialize(self) -> None:
        """Megatron's model-parallel groups over the worker's ranks (a group of one on a single GPU)."""
        try:
            from megatron.core import parallel_state
        except ImportError:
            raise MissingDependency(
                "backend: megatron needs megatron-core: pip install megatron-core==0.16.1"
            ) from None
        self.ensure_process_group()
        if not parallel_state.model_parallel_is_initialized():
            # megatron-core's groups take the plan's bound, not its own 30 minutes (its minutes go into a
            # timedelta, so a fraction of one is kept)
            parallel_state.initialize_model_parallel(
                tensor_model_parallel_size=self.world_size,
                distributed_timeout_minutes=self.ctx.collective_s / 60,
            )

    def _parallel(self, mlp: nn.Sequential, config) -> nn.Sequential:
        """Linears in pairs: column-parallel (output split) then row-parallel (input split, outputs summed),
        so the features between them never leave their rank; an unpaired last linear stays whole."""
        from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

        linears = [i for i, m in enumerate(mlp) if isinstance(m, nn.Linear)]
        layers = list(mlp)
        for column, row in zip(linears[0::2], linears[1::2], strict=False):
            first, second = layers[column], layers[row]
            layers[column] = _Sharded(
                ColumnParallelLinear(
                    first.in_features, first.out_features, config=config, init_method=_keep, bias=True
                ),
                split_dim=0,
                bias_split=True,
            )
            layers[row] = _Sharded(
                RowParallelLinear(
                    second.in_features,
                    second.out_features,
                    config=config,
                    init_method=_keep,
                    bias=True,
                    input_is_parallel=True,
                    skip_bias_add=False,
                ),
                split_dim=1,
                bias_split=False,
            )
            self._load(layers[column], first.weight.detach(), first.bias.detach())
            self._load(layers[row], second.weight.detach(), second.bias.detach())
        return nn.Sequential(*layers)

    def _load(self, sharded: _Sharded, weight: torch.Tensor, bias: torch.Tensor) -> None:
        with torch.no_grad():
            sharded.layer.weight.copy_(weight.chunk(self.world_size, dim=sharded.split_dim)[self.rank])
            sharded.layer.bias.copy_(bias.chunk(self.world_size)[self.rank] if sharded.bias_split else bias)

    # -- the state, in the plain layout ------------------------------------------------------------
    def _entries(self, model: nn.Module) -> list[Entry]:
        if isinstance(model, GPTTrunkPolicy):
            trunk = [
                Entry(plain, param, dim, model.heads if qkv else None)
                for plain, param, dim, qkv in model.trunk_layout()
            ]
            rest = [Entry(k, v) for k, v in model.state_dict(keep_vars=True).items() if not k.startswith("gpt.")]
            return trunk + rest
        sharded = {name: m for name, m in model.named_modules() if isinstance(m, _Sharded)}
        entries = []
        for key, value in model.state_dict(keep_vars=True).items():
            owner, _, leaf = key.rpartition(".layer.")
            module = sharded.get(owner)
            if module is None:
                entries.append(Entry(key, value))
            elif leaf == "weight":
                entries.append(Entry(f"{owner}.weight", value, module.split_dim))
            elif leaf == "bias":
                entries.append(Entry(f"{owner}.bias", value, 0 if module.bias_split else None))
        return entries

    def _gather(self, entry: Entry, local: torch.Tensor) -> torch.Tensor:
        """The plain-layout tensor from every rank's part (a collective when split)."""
        full = local.detach()
        if entry.dim is not None and self.world_size > 1:
            import torch.distributed as dist

            parts = [torch.empty_like(full) for _ in range(self.world_size)]
            dist.all_gather(parts, full.contiguous())
            full = torch.cat(parts, dim=entry.dim)
        return full if entry.heads is None else qkv_from_megatron(full, entry.heads)

    def _scatter(self, entry: Entry, full: torch.Tensor) -> torch.Tensor:
        """This rank's part of a plain-layout tensor."""
        full = full if entry.heads is None else qkv_to_megatron(full, entry.heads)
        return full if entry.dim is None else full.chunk(self.world_size, dim=entry.dim)[self.rank]

    def _distributed(self, entry: Entry, local: torch.Tensor) -> torch.Tensor:
        """For checkpoints: a shard that is a plain split becomes a DTensor view (each rank writes its own,
        loads land in place); a reordered one is gathered whole (and scattered back after a load)."""
        if entry.heads is not None:
            return self._gather(entry, local)
        if entry.dim is None or self.world_size == 1:
            return local.detach()
        from torch.distributed.tensor import DTensor, Shard

        return DTensor.from_local(local.detach(), self._mesh(), [Shard(entry.dim)], run_check=False)

    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        return {e.plain: self._gather(e, e.tensor).detach().clone() for e in self._entries(model)}

    def sharded_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        entries = self._entries(model)
        by_param = {id(e.tensor): e for e in entries}
        _materialize(optimizer)
        per_param, groups = {}, []
        for group in optimizer.param_groups:
            groups.append(
                {
                    **{k: v for k, v in group.items() if k != "params"},
                    "params": [by_param[id(p)].plain for p in group["params"]],
                }
            )
            for p in group["params"]:
                entry = by_param[id(p)]
                per_param[entry.plain] = {
                    k: self._distributed(entry, v) if v.dim() > 0 else v for k, v in optimizer.state[p].items()
                }
        return {
            "model": {e.plain: self._distributed(e, e.tensor) for e in entries},
            "optimizer": {"state": per_param, "param_groups": groups},
        }

    @torch.no_grad()
    def load_sharded_state(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """`state` came from `sharded_state` and was filled in place by the loader: views already hold the
        loaded values; whole (reordered) tensors are scattered back; hyper-parameters are set."""
        for entry in self._entries(model):
            if entry.heads is None:
                continue
            entry.tensor.copy_(self._scatter(entry, state["model"][entry.plain]))
            moments = optimizer.state[entry.tensor]
            for key, loaded in state["optimizer"]["state"][entry.plain].items():
                if loaded.dim() > 0:
                    moments[key].copy_(self._scatter(entry, loaded))
        for group, loaded in zip(optimizer.param_groups, state["optimizer"]["param_groups"], strict=True):
            group.update({k: v for k, v in loaded.items() if k != "params"})

    def _mesh(self):
        if self.mesh is None:
            self.mesh = self.world_mesh()
        return self.mesh

    def clip_grad_norm(self, model: nn.Module, max_norm: float) -> torch.Tensor:
        """The norm of the whole model's gradient: shards summed across ranks, whole tensors counted once."""
        import torch.distributed as dist

        local, once = torch.zeros((), dtype=torch.float64), torch.zeros((), dtype=torch.float64)
        grads = []
        for entry in self._entries(model):
            grad = getattr(entry.tensor, "grad", None)
            if grad is None:
                continue
            grads.append(grad)
            squares = grad.detach().double().square().sum().cpu()
            if entry.dim is not None:
                local += squares
            else:
                once += squares
        if self.world_size > 1:
            reduced = local.to(self.device)
            dist.all_reduce(reduced)
            local = reduced.cpu()
        total = (local + once).sqrt()
        scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for grad in grads:
            grad.mul_(scale.to(grad.device, grad.dtype))
        return total.float()


def _materialize(optimizer: torch.optim.Optimizer) -> None:
    """Adam keeps no state before its first step; a checkpoint to load into needs it: zeros, like a fresh start
    (the step count on the parameter's device where a fused or capturable Adam reads it there)."""
    for group in optimizer.param_groups:
        on_device = group.get("fused") or group.get("capturable")
        for p in group["params"]:
            if not optimizer.state[p]:
                optimizer.state[p] = {
                    "step": torch.zeros((), dtype=torch.float32, device=p.device if on_device else "cpu"),
                    "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
                }


def _keep(weight: torch.Tensor) -> None:
    """No initialisation: the weights are copied from the plain model right after."""
