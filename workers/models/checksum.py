"""A state dict's checksum: the sender sums its state, each receiver checks its copy against the sum, so a
copy cut short, reordered or torn is refused. Element j of the i-th tensor (by name) counts (i + 1)(j + 1)
times, summed in float64 on the tensors' own device, with one wait for the device per device.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch

CHUNK = 2**20  # elements weighted at a time: the positions kept on a device stay at 8 MiB
BLOCK_ROWS = 8  # rows of CHUNK elements turned into float64 at a time: 64 MiB beside the state
_positions: dict[torch.device, torch.Tensor] = {}


def _positions_on(device: torch.device) -> torch.Tensor:
    """1, 2, ..., CHUNK as float64 on `device`, made once."""
    if device not in _positions:
        _positions[device] = torch.arange(1, CHUNK + 1, dtype=torch.float64, device=device)
    return _positions[device]


def _weighted_sum(flat: torch.Tensor) -> torch.Tensor:
    """sum over j of (j + 1) * flat[j], in float64, as a tensor on `flat`'s device (no wait). In a handful of
    kernels per block of rows (on a GPU, launching them costs more than the arithmetic): BLOCK_ROWS whole rows
    of CHUNK elements as one matrix-vector product, element c of row r counting (c + 1) + r * CHUNK, then the
    rest."""
    positions = _positions_on(flat.device)
    rows, rest = divmod(flat.numel(), CHUNK)
    parts = []
    for first in range(0, rows, BLOCK_ROWS):
        count = min(BLOCK_ROWS, rows - first)
        block = flat[first * CHUNK : (first + count) * CHUNK].double().view(count, CHUNK)
        row_index = torch.arange(first, first + count, dtype=torch.float64, device=flat.device)
        parts.append(torch.mv(block, positions).sum() + CHUNK * torch.dot(block.sum(dim=1), row_index))
    if rest:
        tail = flat[rows * CHUNK :].double()
        weighted = torch.dot(tail, positions[:rest])
        parts.append(weighted + rows * CHUNK * tail.sum() if rows else weighted)
    if not parts:  # an empty tensor
        return torch.zeros((), dtype=torch.float64, device=flat.device)
    return torch.stack(parts).sum() if len(parts) > 1 else parts[0]


def state_checksum(state: dict[str, torch.Tensor]) -> float:
    """The position-weighted sum of every tensor in `state` (see the module's docstring)."""
    by_device: dict[torch.device, list[tuple[int, torch.Tensor]]] = defaultdict(list)
    for i, key in enumerate(sorted(state)):
        flat = state[key].detach().reshape(-1)
        by_device[flat.device].append((i + 1, _weighted_sum(flat)))
    total = 0.0
    for sums in by_device.values():
        weights = torch.tensor([i for i, _ in sums], dtype=torch.float64)
        total += float(torch.dot(weights, torch.stack([s for _, s in sums]).cpu()))  # the device's one wait
    return total


def checksum_matches(state: dict[str, torch.Tensor], checksum: float) -> bool:
    """`state` is what the sender summed into `checksum`: equal up to rounding, since the sender may sum on
    another device (a GPU reduces in another order than a CPU)."""
    return math.isclose(state_checksum(state), checksum, rel_tol=1e-9)
