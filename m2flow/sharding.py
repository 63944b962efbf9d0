"""How a loop batch is cut: one shard per replica of the loop's entry worker, S slices per shard.

A worker with fewer replicas takes contiguous blocks of shards; the planner's simulator and the
executor both use these functions, so prediction and execution cut batches the same way.
"""

from __future__ import annotations


def shard_groups(n_shards: int, replicas: int) -> list[list[int]]:
    """Contiguous blocks of shard ids, one block per replica (`replicas <= n_shards`): shard s to its `owner`."""
    return [list(shards_of(n_shards, replicas, r)) for r in range(replicas)]


def shards_of(n_shards: int, replicas: int, replica: int) -> range:
    """The block of shard ids `replica` owns: those s with r <= s * replicas / n_shards < r + 1."""
    return range(-(-replica * n_shards // replicas), -(-(replica + 1) * n_shards // replicas))


def owner(shard: int, n_shards: int, replicas: int) -> int:
    return shard * replicas // n_shards


def slice_sizes(items: int, stages: int) -> list[int]:
    """Envs of one shard per pipeline slice, as even as possible (earlier slices take the remainder)."""
    base, extra = divmod(items, stages)
    return [base + (1 if s < extra else 0) for s in range(stages)]
