"""The weights' checksum: what a receiver checks a synced state against."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

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
    """The tensors laid end to end by name, in float64: element p of that line counts (p + 1) times."""
    line = np.concatenate([state[key].double().reshape(-1).numpy() for key in sorted(state)])
    return float(np.dot(line, np.arange(1, line.size + 1, dtype=np.float64)))


def _mixed_state() -> dict[str, torch.Tensor]:
    """With GROUP = 16: a run of two float32s; one past GROUP (alone, 10 rows of 4 and a rest); two (10,)
    in runs of their own (together past GROUP); bfloat16 and int64 runs (an empty tensor and a 0-dim one
    among them); one of exactly GROUP elements, then one more float32 run."""
    g = torch.Generator().manual_seed(1)
    return {
        "a": torch.randn(2, 2, generator=g),
        "b": torch.randn(2, 2, generator=g),
        "c": torch.randn(41, generator=g),
        "d": torch.randn(10, generator=g),
        "e": torch.randn(10, generator=g),
        "f": torch.randn(5, generator=g).bfloat16(),
        "g": torch.randn(0, 3, generator=g),
        "h": torch.tensor(9),
        "i": torch.arange(-3, 3),
        "j": torch.randn(4, 4, generator=g),
        "k": torch.randn(2, generator=g),
    }


@pytest.fixture
def small_groups(monkeypatch):
    """Groups of 16 elements, rows of 4 in blocks of 2: every path of the grouping at toy size."""
    monkeypatch.setattr(checksum, "GROUP", 16)
    monkeypatch.setattr(checksum, "CHUNK", 4)
    monkeypatch.setattr(checksum, "BLOCK_ROWS", 2)
    monkeypatch.setattr(checksum, "_positions", {})


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


def test_an_empty_state_or_one_of_empty_tensors_sums_to_zero():
    assert state_checksum({}) == 0.0
    assert state_checksum({"x": torch.zeros(0), "y": torch.zeros(3, 0)}) == 0.0


def test_the_grouped_checksum_equals_the_weighted_sum_of_all_tensors_laid_end_to_end(small_groups):
    state = _mixed_state()
    assert state_checksum(state) == pytest.approx(_by_the_definition(state), rel=1e-12)
    assert state_checksum(dict(reversed(state.items()))) == state_checksum(state)  # by name, not insertion


def test_tensors_are_grouped_in_runs_of_one_dtype_up_to_group_and_a_big_tensor_is_not_copied(small_groups):
    state = _mixed_state()
    groups = list(checksum._groups(state))
    # a+b | c | d | e | f | h+i | j | k  (g is empty)
    assert [(start, flat.numel(), flat.dtype) for start, flat in groups] == [
        (0, 8, torch.float32),
        (8, 41, torch.float32),
        (49, 10, torch.float32),
        (59, 10, torch.float32),
        (69, 5, torch.bfloat16),
        (74, 7, torch.int64),
        (81, 16, torch.float32),
        (97, 2, torch.float32),
    ]
    assert groups[1][1].data_ptr() == state["c"].data_ptr()
    assert groups[6][1].data_ptr() == state["j"].data_ptr()


def _swapped(state: dict[str, torch.Tensor], x: str, y: str) -> dict[str, torch.Tensor]:
    return {**state, x: state[y], y: state[x]}


def _one_changed(state: dict[str, torch.Tensor], key: str) -> dict[str, torch.Tensor]:
    changed = state[key].clone()
    changed.view(-1)[-1] += 1
    return {**state, key: changed}


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda s: _swapped(s, "a", "b"), id="swapped-within-a-group"),
        pytest.param(lambda s: _swapped(s, "d", "e"), id="swapped-across-groups"),
        pytest.param(lambda s: _one_changed(s, "c"), id="one-changed-in-a-big-tensor"),
        pytest.param(lambda s: _one_changed(s, "f"), id="one-changed-in-bfloat16"),
        pytest.param(lambda s: _one_changed(s, "h"), id="one-changed-in-a-0-dim-int64"),
        pytest.param(lambda s: {**s, "c": s["c"][:-1]}, id="cut-short"),
    ],
)
def test_a_grouped_copy_with_tensors_swapped_one_element_changed_or_cut_short_does_not_match(small_groups, damage):
    state = _mixed_state()
    assert not checksum_matches(damage(state), state_checksum(state))


class _Kernels(TorchDispatchMode):
    """Counts the ops that compute (on a GPU, each a kernel launch), not those that only view a tensor or read the
    one result back to the host."""

    NOT_COMPUTING = frozenset(
        {"detach", "view", "slice", "_reshape_alias", "alias", "lift_fresh", "_local_scalar_dense"}
    )

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func.__name__.split(".")[0] not in self.NOT_COMPUTING
        return func(*args, **(kwargs or {}))


def test_a_state_of_many_small_tensors_is_summed_in_a_few_kernels_not_a_few_per_tensor():
    """On a GPU a checksum tensor by tensor was bound by launches (~21 ms for the 181 tensors of a 100M ViT)."""
    state = {f"layer{i:03d}": torch.randn(1000) for i in range(200)}
    with _Kernels() as kernels:
        state_checksum(state)
    assert kernels.count <= 8  # one group: lay end to end, to float64, weigh, sum
