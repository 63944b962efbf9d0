"""A rank's samples of a PPO batch as one update reads them: flat rows, gathered once per epoch, cut into
minibatches as views."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch


@dataclass(frozen=True)
class Samples:
    """A rank's samples of the batch, flat [n, ...], as one update reads them."""

    obs: Any  # a tensor or a dict of them
    actions: torch.Tensor
    logprobs: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    behavior_weights: torch.Tensor | None = None  # decoupled PPO's per-sample weights (None: on-policy)

    def rows(self, start: int, end: int) -> Samples:
        """Rows start..end: views, no copies."""
        return self._map(lambda x: x[start:end])

    def in_minibatches(self, rows: torch.Tensor, minibatch_size: int) -> tuple[Samples, list[tuple[int, int, int]]]:
        """One epoch's minibatches, gathered once: `rows` holds this rank's row of each sample of the whole
        batch in the epoch's order (-1: another rank holds it). Returns those of this rank in that order and,
        per minibatch of the whole batch, (start, end) of its rows here and its size over all ranks."""
        held = rows >= 0
        minibatch = torch.arange(len(rows), device=rows.device) // minibatch_size
        sizes = [min(minibatch_size, len(rows) - start) for start in range(0, len(rows), minibatch_size)]
        ends = torch.bincount(minibatch[held], minlength=len(sizes)).cumsum(0).tolist()
        bounds = list(zip([0, *ends[:-1]], ends, sizes, strict=True))
        mine = rows[held]
        return self._map(lambda x: x[mine]), bounds

    def _map(self, fn: Any) -> Samples:
        """`fn` applied to every field (to each observation tensor of a dict)."""
        rest = (getattr(self, f.name) for f in fields(self)[1:])
        return Samples(apply_to_obs(self.obs, fn), *(fn(x) if x is not None else None for x in rest))


def apply_to_obs(obs: Any, fn: Any) -> Any:
    """`fn` on an observation tensor, or on each of a dict of them."""
    return {key: fn(value) for key, value in obs.items()} if isinstance(obs, dict) else fn(obs)
