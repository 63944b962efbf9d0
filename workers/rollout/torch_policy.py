"""Inference worker: a torch policy that turns observations into actions, log-probs and values.

Weights arrive from the training worker as `{"version": n, "state": state_dict}`; a version older
than the one loaded, or a state whose keys or shapes do not match the model, is refused.

An env's action must not depend on how envs are batched (pipeline slices cut the batch): each env draws
its noise from its own stream, and every call is padded to a multiple of `ROW_MULTIPLE` rows, because
BLAS picks its matmul kernel by row count and MKL's kernel for fewer than 4 rows rounds differently —
a 1-ulp difference that chaotic physics grows into different trajectories. (Seen with MKL on CPU; other
BLAS libraries and GPUs may need another multiple.) So `act` is declared `batch_invariant`: the loop may
merge pipeline slices into one call of it (`planners/merging.py`). That holds on CPU given `env_id`s, as the
built-in simulators send them. Without them the model draws every env's noise from one stream, and on a GPU
kernels chosen by row count may round differently: which slices merge depends on when they arrive, so such a
run may not repeat to the last bit (`placement.merge_slices: false` makes it repeat).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import Field

import m2flow
from m2flow.errors import WorkerError
from m2flow.workers.models import PolicyArgs, state_bytes
from m2flow.workers.models.precision import Precision, compute_in

if TYPE_CHECKING:
    import torch

ROW_MULTIPLE = 4


class TorchPolicyConfig(PolicyArgs):
    deterministic: bool = Field(False, description="act with the mean action (evaluation), no exploration noise")
    precision: Precision = Field(
        "fp32", description="bf16: act under bf16 autocast, as a training worker with `precision: bf16` computes"
    )
    cuda_graphs: bool = Field(
        True,
        description="on a CUDA device, replay the act call as one CUDA graph per batch shape, captured on its"
        " first use (kernel launches then cost little: `workers/models/cuda_graph.py`); false: eager",
    )


class TorchPolicy:
    Config = TorchPolicyConfig
    batch_invariant = frozenset({"act"})

    def __init__(self, **args: Any):
        import torch

        ctx = m2flow.context()
        self.args = cfg = TorchPolicyConfig(**args)
        self.deterministic = cfg.deterministic
        torch.manual_seed(ctx.seed)
        self.device = torch.device(ctx.device)
        self.model = self.args.build().to(self.device).eval()
        self.graphs = None
        if self.device.type == "cuda" and cfg.cuda_graphs:
            from m2flow.workers.models.cuda_graph import CudaGraphs

            self.graphs = CudaGraphs(self.device, cfg.precision)
        self._frozen = {name for name, p in self.model.named_parameters() if not p.requires_grad}
        self.act_dim, self.seed = self.model.act_dim, ctx.seed
        self.env_rngs: dict[int, np.random.Generator] = {}
        self.version = -1

    @staticmethod
    def memory_estimate_gb(config: TorchPolicyConfig, samples: int) -> float:
        """The model's weights: acting keeps no activations for a backward (one layer's at a time)."""
        return state_bytes(config) / 2**30

    def act(self, batch: dict[str, np.ndarray] | np.ndarray) -> dict[str, np.ndarray]:
        """Actions for a batch of observations. Given `env_id`s (as `GymEnv` sends them), each env's
        exploration noise comes from its own stream, so results do not depend on how envs are batched."""
        import torch

        with torch.no_grad():
            return self._act(batch)

    def _act(self, batch: dict[str, np.ndarray] | np.ndarray) -> dict[str, np.ndarray]:
        x = self.model.inputs(batch, self.device)
        rows = len(next(iter(x.values())) if isinstance(x, dict) else x)
        pad = -rows % ROW_MULTIPLE
        x = _pad(x, pad)
        if self.deterministic:
            return {"action": _rows(self._forward("mean action", self.model.mean_action, x), rows)}
        env_ids = batch.get("env_id") if isinstance(batch, dict) else None
        if env_ids is None:  # the model draws the noise
            action, logprob, _, value = self._forward("act", self.model.get_action_and_value, x)
        else:
            noise = _pad(self._noise(env_ids, rows), pad)
            action, logprob, _, value = self._forward("act with each env's noise", self._sample, x, noise)
        return {
            "action": _rows(action, rows),
            "logprob": _rows(logprob, rows),
            "value": _rows(value, rows),
            "policy_version": np.full(rows, self.version, dtype=np.int64),  # training measures staleness by it
        }

    def _forward(self, name: str, fn, *args):
        """`fn(*args)` in the worker's precision: replayed from a CUDA graph where there are graphs."""
        if self.graphs is not None:
            return self.graphs.run(f"{name} of {type(self.model).__name__}", fn, *args)
        with compute_in(self.device, self.args.precision):
            return fn(*args)

    def _sample(self, x, noise):
        return self.model.get_action_and_value(x, noise=noise)

    def _noise(self, env_ids: np.ndarray, n: int) -> torch.Tensor:
        from m2flow.workers.models.host_copy import from_host

        draws = np.empty((n, self.act_dim), dtype=np.float32)
        for row, env_id in enumerate(env_ids):
            rng = self.env_rngs.get(int(env_id))
            if rng is None:
                rng = self.env_rngs[int(env_id)] = np.random.default_rng([self.seed, int(env_id)])
            draws[row] = rng.standard_normal(self.act_dim, dtype=np.float32)
        return from_host(draws, self.device)

    def state_dict(self) -> dict[str, Any]:
        """The per-env noise streams (weights come with each sync), so a resumed run draws the same noise."""
        return {"env_rngs": {str(k): rng.bit_generator.state for k, rng in self.env_rngs.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, saved in state["env_rngs"].items():
            rng = self.env_rngs[int(key)] = np.random.default_rng()
            rng.bit_generator.state = saved

    def offload(self) -> None:
        """Free the device for a worker sharing it: the model goes to pinned host memory (CUDA only)."""
        if self.device.type == "cuda":
            import torch

            from m2flow.workers.models.placement import move_module

            move_module(self.model, torch.device("cpu"))
            if self.graphs is not None:  # they hold the parameters' old addresses
                self.graphs.clear()
            torch.cuda.empty_cache()

    def onload(self) -> None:
        if self.device.type == "cuda":
            from m2flow.workers.models.placement import move_module

            move_module(self.model, self.device)

    def load_weights(self, weights: dict[str, Any]) -> int:
        """Load a versioned state dict; refuses stale versions and torn states (incomplete, misshapen, or
        contents that do not match the sender's checksum)."""
        version, state = weights.get("version"), weights.get("state")
        if not isinstance(version, int) or not isinstance(state, dict):
            raise WorkerError("load_weights: expected {'version': int, 'state': state_dict}")
        if version < self.version:
            raise WorkerError(f"load_weights: stale weights version {version}, already at {self.version}")
        own = self.model.state_dict()
        if weights.get("scope") == "trainable":  # frozen weights (a LoRA base) stay as loaded from their folder
            own = {k: v for k, v in own.items() if k not in self._frozen}
        missing, extra = own.keys() - state.keys(), state.keys() - own.keys()
        bad = [k for k in own.keys() & state.keys() if tuple(state[k].shape) != tuple(own[k].shape)]
        if missing or extra or bad:
            raise WorkerError(
                f"load_weights: torn weights v{version}: missing {sorted(missing)[:3]},"
                f" unexpected {sorted(extra)[:3]}, wrong shape {bad[:3]}"
            )
        from m2flow.workers.models.checksum import checksum_matches

        if "checksum" in weights and not checksum_matches(state, weights["checksum"]):
            raise WorkerError(f"load_weights: torn weights v{version}: contents do not match their checksum")
        self.model.load_state_dict(state, strict=weights.get("scope") != "trainable")
        self.version = version
        return version


def _rows(x: torch.Tensor, rows: int) -> np.ndarray:
    """The first `rows` rows (the padding dropped) as float32 numpy."""
    return x[:rows].float().cpu().numpy()


def _pad(x: torch.Tensor | dict[str, torch.Tensor], rows: int) -> torch.Tensor | dict[str, torch.Tensor]:
    """`rows` more rows, copies of the first (their outputs are dropped)."""
    if not rows:
        return x
    if isinstance(x, dict):
        return {key: _pad(value, rows) for key, value in x.items()}
    import torch

    return torch.cat([x, x[:1].expand(rows, *x.shape[1:])])
