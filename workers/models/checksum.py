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
    """sum over j of (j + 1) * flat[j], in float64, as a tensor on `flat`'s device (no wait)."""
    positions = _positions_on(flat.device)
    total = torch.zeros((), dtype=torch.float64, device=flat.device)
    for start in range(0, flat.numel(), CHUNK):
        chunk = flat[start : start + CHUNK].double()
        total += torch.dot(chunk, positions[: chunk.numel()]) + start * chunk.sum()
    return total


def state_checksum(state: dict[str, torch.Tensor]) -> float:
    """The position-weighted sum of every tensor in `state` (see the module's docstring)."""
    by_device: dict[torch.device, list[torch.Tensor]] = defaultdict(list)
    for i, key in enumerate(sorted(state)):
        flat = state[key].detach().reshape(-1)
        by_device[flat.device].append((i + 1) * _weighted_sum(flat))
    return sum(float(torch.stack(sums).sum()) for sums in by_device.values())


def checksum_matches(state: dict[str, torch.Tensor], checksum: float) -> bool:
    """`state` is what the sender summed into `checksum`: equal up to rounding, since the sender may sum on
    another device (a GPU reduces in another order than a CPU)."""
    return math.isclose(state_checksum(state), checksum, rel_tol=1e-9)
