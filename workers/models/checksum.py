"""A state dict's checksum: the sender sums its state, each receiver checks its copy against the sum, so a
copy cut short, reordered or torn is refused. Element j of the i-th tensor (by name) counts (i + 1)(j + 1)
times, summed in float64 on the tensors' own device, with one wait for the device per device.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch

CHUNK = 2**20  # elements weighted at a time: the positions kept on a device stay at 8 MiB
_positions: dict[torch.device, torch.Tensor] = {}


def _positions_on(device: torch.device) -> torch.Tensor:
    """1, 2, ..., CHUNK as float64 on `device`, made once."""
    if device not in _positions:
        _positions[device] = torch.arange(1, CHUNK + 1, dtype=torch.float64, device=device)
    return _positions[device]


def _weighted_sum(flat: torch.Tensor) -> torch.Tensor:
    """sum over j of (j + 1) * flat[j], in float64, as a tensor on `flat`'s device (no wait). In a handful of
    kernels whatever the length (on a GPU, launching them costs more than the arithmetic): the whole rows of
    CHUNK elements as one matrix-vector product, element c of row r counting (c + 1) + r * CHUNK, and the rest."""
    positions = _positions_on(flat.device)
    x = flat.double()
    rows, rest = divmod(x.numel(), CHUNK)
    tail = x[rows * CHUNK :]
    total = torch.dot(tail, positions[:rest]) + rows * CHUNK * tail.sum()
    if rows:
        matrix = x[: rows * CHUNK].view(rows, CHUNK)
        row_index = torch.arange(rows, dtype=torch.float64, device=flat.device)
        total = total + torch.mv(matrix, positions).sum() + CHUNK * torch.dot(matrix.sum(dim=1), row_index)
    return total


def state_checksum(state: dict[str, torch.Tensor]) -> float:
    """The position-weighted sum of every tensor in `state` (see the module's docstring)."""
    by_device: dict[torch.device, list[tuple[int, torch.Tensor]]] = defaultdict(list)
    for i, key in enumerate(sorted(state)):
        flat = state[key].detach().reshape(-1)
        by_device[flat.device].append((i + 1, _weighted_sum(flat)))
    total = 0.0
    for device, sums in by_device.items():
        weights = torch.tensor([i for i, _ in sums], dtype=torch.float64, device=device)
        total += float(torch.dot(weights, torch.stack([s for _, s in sums])))
    return total


def checksum_matches(state: dict[str, torch.Tensor], checksum: float) -> bool:
    """`state` is what the sender summed into `checksum`: equal up to rounding, since the sender may sum on
    another device (a GPU reduces in another order than a CPU)."""
    return math.isclose(state_checksum(state), checksum, rel_tol=1e-9)
