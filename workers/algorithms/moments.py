"""Running mean and variance: Chan et al.'s parallel update, for observation and return normalisers whose
batches are spread over data-parallel ranks."""

from __future__ import annotations

from collections.abc import Callable

import torch

# (per-rank means [R, ...], variances [R, ...], counts [R]) of one batch -> the whole batch's (mean, var, count)
Moments = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
Combine = Callable[[torch.Tensor, torch.Tensor, float], Moments]


def merge(mean: torch.Tensor, var: torch.Tensor, count: torch.Tensor, batch: Moments) -> Moments:
    """Fold one batch's moments into running ones (what gymnasium's RunningMeanStd does)."""
    batch_mean, batch_var, n = batch
    delta, total = batch_mean - mean, count + n
    new_mean = mean + delta * n / total
    new_var = (var * count + batch_var * n + delta * delta * count * n / total) / total  # tensors or arrays
    return new_mean, new_var, total


def across_ranks(gather: Callable[[torch.Tensor], torch.Tensor]) -> Combine:
    """A `Combine` over data-parallel ranks: `gather` stacks a tensor of every rank ([R, ...])."""

    def combine(mean: torch.Tensor, var: torch.Tensor, n: float) -> Moments:
        local = torch.cat([mean.reshape(-1), var.reshape(-1), torch.tensor([float(n)], dtype=mean.dtype)])
        every = gather(local)
        width = mean.numel()
        means, variances, counts = every[:, :width], every[:, width : 2 * width], every[:, -1]
        out = (means[0], variances[0], counts[0])
        for r in range(1, every.shape[0]):
            out = merge(*out, (means[r], variances[r], counts[r]))
        return out[0].reshape(mean.shape), out[1].reshape(var.shape), out[2]

    return combine
