"""A state dict's checksum: the sender sums its state, each receiver checks its copy against the sum, so a
copy cut short, reordered or torn is refused. Element j of the i-th tensor (by name) counts (i + 1)(j + 1)
times, summed in float64 on the tensors' own device, with one wait for the device per device.

Two ways to sum, by the device the tensors are on (`SUMS`):
- on a CPU the arithmetic costs most: each tensor is weighed by a dot product against the places 1..CHUNK
  (whole rows of CHUNK elements as one matrix-vector product), a pass over its elements in float64;
- on a GPU a state's hundreds of tensors cost more in kernel launches than in arithmetic: they are weighed
  in groups of up to GROUP elements of one dtype, each group in a handful of kernels (its tensors laid end
  to end, each element times its place in the group, summed per tensor by one segmented reduction); the
  host then turns places in the group into places in each tensor: for a piece of tensor i that starts at
  element k of the tensor and at place o of the group, sum (j + 1) x_j = S1 + (k - o) S0, S1 the
  place-weighted and S0 the plain sum of the piece.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

CHUNK = 2**20  # a CPU's places 1..CHUNK, kept per device: 8 MiB
BLOCK_ROWS = 8  # rows of CHUNK elements turned into float64 at a time: 64 MiB beside the state
GROUP = 2**23  # elements a GPU weighs together: about 200 MiB of float64 work space beside the state
_positions: dict[torch.device, torch.Tensor] = {}

Tensors = list[tuple[int, torch.Tensor]]  # (i + 1, the i-th tensor flattened), on one device


def _positions_on(device: torch.device) -> torch.Tensor:
    """1, 2, ..., CHUNK as float64 on `device`, made once."""
    if device not in _positions:
        _positions[device] = torch.arange(1, CHUNK + 1, dtype=torch.float64, device=device)
    return _positions[device]


def _weighted_sum(flat: torch.Tensor) -> torch.Tensor:
    """sum over j of (j + 1) * flat[j], in float64, as a tensor on `flat`'s device (no wait): BLOCK_ROWS whole
    rows of CHUNK elements at a time as one matrix-vector product, element c of row r counting
    (c + 1) + r * CHUNK, then the rest."""
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


def _tensor_by_tensor(tensors: Tensors) -> float:
    """The weighted sum, one tensor after the other (where the arithmetic costs most)."""
    if not tensors:
        return 0.0
    weights = torch.tensor([weight for weight, _ in tensors], dtype=torch.float64)
    sums = torch.stack([_weighted_sum(flat) for _, flat in tensors])
    return float(torch.dot(weights, sums.cpu()))  # the device's one wait


@dataclass(frozen=True)
class _Piece:
    weight: int  # i + 1, the tensor's place by name
    start: int  # the piece's first element in its tensor
    flat: torch.Tensor  # the piece, flattened


def _groups(tensors: Tensors) -> list[list[_Piece]]:
    """The tensors cut into groups of up to GROUP elements of one dtype (laid end to end, they keep their
    values exactly), a tensor longer than GROUP in pieces."""
    groups: list[list[_Piece]] = [[]]
    room = GROUP
    for weight, flat in sorted(tensors, key=lambda tensor: str(tensor[1].dtype)):
        if groups[-1] and groups[-1][-1].flat.dtype != flat.dtype:
            room = 0
        start = 0
        while start < flat.numel():
            if room == 0:
                groups.append([])
                room = GROUP
            size = min(room, flat.numel() - start)
            groups[-1].append(_Piece(weight, start, flat[start : start + size]))
            start, room = start + size, room - size
    return [group for group in groups if group]


def _group_sums(group: list[_Piece], lengths: torch.Tensor) -> torch.Tensor:
    """Per piece of `group`, [S1, S0] in float64 on its device (no wait)."""
    values = torch.cat([piece.flat for piece in group]).double()
    places = torch.arange(1, values.numel() + 1, dtype=torch.float64, device=values.device)
    plain = torch.segment_reduce(values, "sum", lengths=lengths, unsafe=True)
    weighted = torch.segment_reduce(values * places, "sum", lengths=lengths, unsafe=True)
    return torch.stack([weighted, plain])


def _in_groups(tensors: Tensors) -> float:
    """The weighted sum, groups of tensors at a time (where kernel launches cost most)."""
    groups = _groups([(weight, flat) for weight, flat in tensors if flat.numel()])
    if not groups:
        return 0.0
    device = groups[0][0].flat.device
    counts = [len(group) for group in groups]
    sizes = torch.tensor([piece.flat.numel() for group in groups for piece in group], dtype=torch.int64)
    lengths = sizes.to(device).split(counts)  # one copy to the device for every group
    sums = torch.cat([_group_sums(group, own) for group, own in zip(groups, lengths, strict=True)], dim=1)
    weighted, plain = sums.cpu().numpy()  # the device's one wait
    weights = np.array([piece.weight for group in groups for piece in group], dtype=np.float64)
    places = np.concatenate([np.cumsum([0] + [piece.flat.numel() for piece in group[:-1]]) for group in groups])
    starts = np.array([piece.start for group in groups for piece in group], dtype=np.float64)
    return float(np.dot(weights, weighted + (starts - places) * plain))


SUMS: dict[str, Callable[[Tensors], float]] = {"cuda": _in_groups}  # by device type; any other: _tensor_by_tensor


def state_checksum(state: dict[str, torch.Tensor]) -> float:
    """The position-weighted sum of every tensor in `state` (see the module's docstring)."""
    by_device: dict[torch.device, Tensors] = defaultdict(list)
    for i, key in enumerate(sorted(state)):
        flat = state[key].detach().reshape(-1)
        by_device[flat.device].append((i + 1, flat))
    return sum(SUMS.get(device.type, _tensor_by_tensor)(tensors) for device, tensors in by_device.items())


def checksum_matches(state: dict[str, torch.Tensor], checksum: float) -> bool:
    """`state` is what the sender summed into `checksum`: equal up to rounding, since the sender may sum on
    another device (a GPU reduces in another order than a CPU)."""
    return math.isclose(state_checksum(state), checksum, rel_tol=1e-9)
