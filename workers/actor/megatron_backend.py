"""Megatron-core backend: tensor parallelism over all of the worker's ranks (TP = ranks, one data replica).

Each MLP of the policy (`nn.Sequential` of `Linear` and element-wise layers) becomes alternating
column- and row-parallel layers of megatron-core, initialised from the same full weights, so a TP=2
group computes what one rank computes. Every rank sees the whole minibatch. Full state dicts (weight
sync, checkpoints) gather the shards back into the plain layout, so inference workers and checkpoints do
not know TP was used. Runs on CPU over gloo; CUDA/NCCL where there is a GPU.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from m2flow.errors import MissingDependency
from m2flow.workers.actor.backends import TrainingBackend, register_backend


class _Sharded(nn.Module):
    """A megatron parallel linear that returns only its output; remembers how it splits the full weight."""

    def __init__(self, layer: nn.Module, split_dim: int, bias_split: bool):
        super().__init__()
        self.layer, self.split_dim, self.bias_split = layer, split_dim, bias_split

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, bias = self.layer(x)
        return out if bias is None else out + bias


@register_backend
class MegatronBackend(TrainingBackend):
    name = "megatron"

    def __init__(self, ctx):
        super().__init__(ctx)
        self.data_rank, self.data_world = 0, 1  # tensor parallel: every rank works on the same samples

    def wrap(self, model: nn.Module) -> nn.Module:
        if self.world_size == 1:
            return model
        try:
            from megatron.core import parallel_state
            from megatron.core.model_parallel_config import ModelParallelConfig
        except ImportError:
            raise MissingDependency(
                "backend: megatron needs megatron-core: pip install megatron-core==0.16.1"
            ) from None
        if not parallel_state.model_parallel_is_initialized():
            parallel_state.initialize_model_parallel(tensor_model_parallel_size=self.world_size)
        config = ModelParallelConfig(
            tensor_model_parallel_size=self.world_size, use_cpu_initialization=True, params_dtype=torch.float32
        )
        for name, child in model.named_children():
            if isinstance(child, nn.Sequential) and any(isinstance(m, nn.Linear) for m in child):
                setattr(model, name, self._parallel(child, config))
        return model

    def _parallel(self, mlp: nn.Sequential, config) -> nn.Sequential:
        from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

        linears = [i for i, m in enumerate(mlp) if isinstance(m, nn.Linear)]
        layers = list(mlp)
        for position, index in enumerate(linears):
            full: nn.Linear = layers[index]
            column = position % 2 == 0
            last = position == len(linears) - 1
            if column:
                layer = ColumnParallelLinear(
                    full.in_features, full.out_features, config=config, init_method=_keep, bias=True, gather_output=last
                )
                sharded = _Sharded(layer, split_dim=0, bias_split=True)
            else:
                layer = RowParallelLinear(
                    full.in_features,
                    full.out_features,
                    config=config,
                    init_method=_keep,
                    bias=True,
                    input_is_parallel=True,
                    skip_bias_add=False,
                )
                sharded = _Sharded(layer, split_dim=1, bias_split=False)
            self._load(sharded, full.weight.detach(), full.bias.detach())
            layers[index] = sharded
        return nn.Sequential(*layers)

    def _load(self, sharded: _Sharded, weight: torch.Tensor, bias: torch.Tensor) -> None:
        with torch.no_grad():
            sharded.layer.weight.copy_(weight.chunk(self.world_size, dim=sharded.split_dim)[self.rank])
            sharded.layer.bias.copy_(bias.chunk(self.world_size)[self.rank] if sharded.bias_split else bias)

    def _gather(self, shard: torch.Tensor, dim: int) -> torch.Tensor:
        import torch.distributed as dist

        parts = [torch.empty_like(shard) for _ in range(self.world_size)]
        dist.all_gather(parts, shard.detach().contiguous())
        return torch.cat(parts, dim=dim)

    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        sharded = {f"{name}.": m for name, m in model.named_modules() if isinstance(m, _Sharded)}
        state = {}
        for key, value in model.state_dict().items():
            prefix = next((p for p in sharded if key.startswith(p)), None)
            if prefix is None:
                state[key] = value.detach().cpu().clone()
                continue
            module, leaf = sharded[prefix], key.rsplit(".", 1)[-1]
            plain = f"{prefix}{leaf}"
            if leaf == "weight":
                state[plain] = self._gather(value, module.split_dim).cpu()
            elif leaf == "bias":
                state[plain] = (self._gather(value, 0) if module.bias_split else value.detach()).cpu().clone()
        return state

    def load_full_state_dict(self, model: nn.Module, state: dict[str, torch.Tensor]) -> None:
        sharded = {f"{name}.": m for name, m in model.named_modules() if isinstance(m, _Sharded)}
        plain = {k: v for k, v in state.items() if not any(k.startswith(p) for p in sharded)}
        model.load_state_dict(plain, strict=False)
        for prefix, module in sharded.items():
            self._load(module, state[f"{prefix}weight"], state[f"{prefix}bias"])

    def optimizer_state_dict(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """This rank's optimizer state (shards of TP layers); resume requires the same TP size."""
        return {"rank": self.rank, "tp": self.world_size, "state": optimizer.state_dict()}

    def load_optimizer_state_dict(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
        if state.get("tp") != self.world_size:
            raise MissingDependency(
                f"the checkpoint's optimizer is sharded for TP={state.get('tp')}, this run uses"
                f" TP={self.world_size}; resume with the same workers.<name>.replicas"
            )
        optimizer.load_state_dict(state["state"])

    def clip_grad_norm(self, model: nn.Module, max_norm: float) -> torch.Tensor:
        """The norm of the whole model's gradient: shards summed across ranks, replicated parameters once."""
        import torch.distributed as dist

        sharded_params = {id(p) for m in model.modules() if isinstance(m, _Sharded) for p in m.parameters()}
        replicated_bias = {id(m.layer.bias) for m in model.modules() if isinstance(m, _Sharded) and not m.bias_split}
        local, once = torch.zeros((), dtype=torch.float64), torch.zeros((), dtype=torch.float64)
        grads = [p for p in model.parameters() if p.grad is not None]
        for p in grads:
            squares = p.grad.detach().double().square().sum()
            if id(p) in sharded_params and id(p) not in replicated_bias:
                local += squares
            else:
                once += squares
        if self.world_size > 1:
            dist.all_reduce(local)
        total = (local + once).sqrt()
        scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for p in grads:
            p.grad.mul_(scale.to(p.grad.dtype))
        return total.float()


def _keep(weight: torch.Tensor) -> None:
    """No initialisation: the weights are copied from the plain model right after."""
