"""A state dict's checksum: the sender sums its state, each receiver checks its copy against the sum, so a
copy cut short, reordered or torn is refused. The state's tensors, each flattened, are laid end to end in
name order, and element p (from 0) of that line counts (p + 1) times, summed in float64 on the tensors' own
device, with one wait for the device per device.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator

import torch

CHUNK = 2**20  # elements weighted at a time: the positions kept on a device stay at 8 MiB
BLOCK_ROWS = 8  # rows of CHUNK elements turned into float64 at a time: 64 MiB, beside a group laid end to end
GROUP = 2**23  # elements summed as one: small tensors are laid end to end so a state costs a few ops per group
_positions: dict[torch.device, torch.Tensor] = {}


def _positions_on(device: torch.device) -> torch.Tensor:
    """1, 2, ..., CHUNK as float64 on `device`, made once."""
    if device not in _positions:
        _positions[device] = torch.arange(1, CHUNK + 1, dtype=torch.float64, device=device)
    return _positions[device]


def _weighted_sum(flat: torch.Tensor, start: int) -> torch.Tensor:
    """sum over j of (start + j + 1) * flat[j] (`flat` not empty), in float64, as a tensor on `flat`'s device (no
    wait). In a handful of kernels per block of rows (on a GPU, launching them costs more than the arithmetic):
    BLOCK_ROWS whole rows of CHUNK elements as one matrix-vector product, element c of row r counting
    (c + 1) + start + r * CHUNK, then the rest."""
    positions = _positions_on(flat.device)
    rows, rest = divmod(flat.numel(), CHUNK)
    parts = []
    for first in range(0, rows, BLOCK_ROWS):
        count = min(BLOCK_ROWS, rows - first)
        block = flat[first * CHUNK : (first + count) * CHUNK].double().view(count, CHUNK)
        row_start = torch.arange(
            start + first * CHUNK, start + (first + count) * CHUNK, CHUNK, dtype=torch.float64, device=flat.device
        )
        parts.append(torch.mv(block, positions).sum() + torch.dot(block.sum(dim=1), row_start))
    if rest:
        tail = flat[rows * CHUNK :].double()
        weighted = torch.dot(tail, positions[:rest])
        offset = start + rows * CHUNK
        parts.append(weighted + offset * tail.sum() if offset else weighted)
    return torch.stack(parts).sum() if len(parts) > 1 else parts[0]


def _groups(state: dict[str, torch.Tensor]) -> Iterator[tuple[int, torch.Tensor]]:
    """The state's line of elements (see the module's docstring) in pieces of one device and dtype, each with
    its first element's position: runs of consecutive tensors up to GROUP elements laid end to end by one
    copy; a tensor of GROUP elements or more alone, not copied. Empty tensors count nothing and are left out."""
    run: list[torch.Tensor] = []
    start = size = 0
    for key in sorted(state):
        flat = state[key].detach().reshape(-1)
        if not flat.numel():
            continue
        if run and (flat.device != run[0].device or flat.dtype != run[0].dtype or size + flat.numel() > GROUP):
            yield start, torch.cat(run) if len(run) > 1 else run[0]
            run, start, size = [], start + size, 0
        run.append(flat)
        size += flat.numel()
    if run:
        yield start, torch.cat(run) if len(run) > 1 else run[0]


def state_checksum(state: dict[str, torch.Tensor]) -> float:
    """The position-weighted sum of every tensor in `state` (see the module's docstring)."""
    by_device: dict[torch.device, list[torch.Tensor]] = defaultdict(list)
    for start, flat in _groups(state):
        by_device[flat.device].append(_weighted_sum(flat, start))
    return math.fsum(float(torch.stack(sums).sum()) for sums in by_device.values())  # each device's one wait


def checksum_matches(state: dict[str, torch.Tensor], checksum: float) -> bool:
    """`state` is what the sender summed into `checksum`: equal up to rounding, since the sender may sum on
    another device (a GPU reduces in another order than a CPU)."""
    return math.isclose(state_checksum(state), checksum, rel_tol=1e-9)
