"""The weights' checksum: what a receiver checks a synced state against."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from m2flow.workers.models import checksum
from m2flow.workers.models.checksum import checksum_matches, state_checksum


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "a.weight": torch.randn(13, 7, generator=g),
        "a.bias": torch.randn(7, generator=g, dtype=torch.float64).bfloat16(),
        "steps": torch.tensor(9),
        "b.weight": torch.randn(0, 3),
    }


def _by_the_definition(state: dict[str, torch.Tensor]) -> float:
    """Element j of the i-th tensor by name counts (i + 1)(j + 1) times, in float64."""
    total = 0.0
    for i, key in enumerate(sorted(state)):
        flat = state[key].double().reshape(-1).numpy()
        total += (i + 1) * float(np.dot(flat, np.arange(1, flat.size + 1, dtype=np.float64)))
    return total


# tensors in one piece; cut into rows of 5 and a rest; into rows of 7 and no rest (13 x 7 elements, 7)
# and 18 rows of 5 turned into float64 in blocks of 4, the last of 2
@pytest.mark.parametrize(("chunk", "block_rows"), [(checksum.CHUNK, 8), (5, 8), (7, 8), (5, 4)])
def test_the_checksum_is_the_position_weighted_sum_of_every_tensor_however_it_is_chunked(
    monkeypatch, chunk, block_rows
):
    monkeypatch.setattr(checksum, "CHUNK", chunk)
    monkeypatch.setattr(checksum, "BLOCK_ROWS", block_rows)
    monkeypatch.setattr(checksum, "_positions", {})
    state = _state()
    assert state_checksum(state) == pytest.approx(_by_the_definition(state), rel=1e-12)
    assert checksum_matches({k: v.clone() for k, v in state.items()}, _by_the_definition(state))


def test_an_int64_beyond_float32_precision_is_summed_exactly():
    big = {"n": torch.tensor(2**40 + 3), "x": torch.ones(3)}
    assert state_checksum(big) == _by_the_definition(big)


def test_a_copy_with_one_element_changed_or_two_tensors_swapped_does_not_match():
    state = _state()
    sent = state_checksum(state)
    changed = {k: v.clone() for k, v in state.items()}
    changed["a.weight"][12, 6] += 1e-3
    assert not checksum_matches(changed, sent)
    reordered = {k: v.clone() for k, v in state.items()}
    reordered["a.weight"] = reordered["a.weight"].flip(0)
    assert not checksum_matches(reordered, sent)
    swapped = {"x": torch.ones(3), "y": torch.full((3,), 2.0)}
    assert not checksum_matches({"x": swapped["y"], "y": swapped["x"]}, state_checksum(swapped))
