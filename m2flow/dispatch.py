"""The dispatch vocabulary: how one call of a port is split over a worker's replicas, and whose outputs
stand for the group. The controller applies it to Ray object references, the event simulator to task ids
and item counts: both go through these functions, so prediction and execution cut batches alike."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from m2flow.sharding import shard_groups
from m2flow.spec import Dispatch

T = TypeVar("T")


def _broadcast(inputs: Sequence[T], replicas: int, data_parallel: int) -> list[list[T]]:
    return [list(inputs) for _ in range(replicas)]


def _shard(inputs: Sequence[T], replicas: int, data_parallel: int) -> list[list[T]]:
    """Data-parallel rank d receives the d-th contiguous block of the input shards; the replicas/d ranks of
    one model-parallel group (consecutive ranks) receive the same block."""
    blocks = shard_groups(len(inputs), data_parallel)
    return [[inputs[i] for i in blocks[r * data_parallel // replicas]] for r in range(replicas)]


def _first(inputs: Sequence[T], replicas: int, data_parallel: int) -> list[list[T]]:
    return [list(inputs)] + [[] for _ in range(replicas - 1)]


def _everyone(replicas: int) -> list[int]:
    return list(range(replicas))


def _first_only(replicas: int) -> list[int]:
    return [0]


@dataclass(frozen=True)
class Split:
    """One split rule: how it cuts a call's input shards over the replicas, and which replicas a sync edge copies a
    state to (a state is not cut: a shard split sends it whole)."""

    cut: Callable[[Sequence, int, int], list[list]]
    receivers: Callable[[int], list[int]]
    state_only: bool = False  # leaves replicas without a part of a batch: for ports a sync edge copies a state to


SPLITS: dict[str, Split] = {
    "broadcast": Split(_broadcast, _everyone),
    "shard": Split(_shard, _everyone),
    "first": Split(_first, _first_only, state_only=True),
}
GATHERS: dict[str, Callable[[list], list]] = {"all": lambda outputs: outputs, "rank_zero": lambda outputs: outputs[:1]}


def split(rule: Dispatch, inputs: Sequence[T], replicas: int, data_parallel: int) -> list[list[T]]:
    """Per replica, the input shards it receives."""
    return SPLITS[rule.split].cut(inputs, replicas, data_parallel)


def gather(rule: Dispatch, outputs: list[T]) -> list[T]:
    """The outputs that stand for the worker downstream, one per shard it produced."""
    return GATHERS[rule.gather](outputs)


def state_receivers(rule: Dispatch, replicas: int) -> list[int]:
    """The replicas a sync edge's state goes to, where its destination port's rule is `rule`."""
    return SPLITS[rule.split].receivers(replicas)


def shards_needed(rule: Dispatch, data_parallel: int) -> int:
    """The fewest input shards a call can be split by: one per data-parallel rank when sharding."""
    return data_parallel if rule.split == "shard" else 1


def state_only(rule: Dispatch) -> bool:
    """Whether `rule` sends a port's input to some replicas only: a state's split, never a batch's."""
    return SPLITS[rule.split].state_only
