"""Concatenate the loop data of several shards along the batch axis, and split it back.

Loop data is a numpy array or a (nested) dict of them, batch first. With one shard per call nothing
is copied and any picklable value passes through.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class BatchingError(TypeError):
    pass


def leading_size(value: Any) -> int:
    if isinstance(value, dict):
        for item in value.values():
            return leading_size(item)
        return 0
    shape = getattr(value, "shape", None)
    return int(shape[0]) if shape else 1


def concat(parts: list[Any]) -> tuple[Any, list[int]]:
    sizes = [leading_size(p) for p in parts]
    if len(parts) == 1:
        return parts[0], sizes
    return _concat(parts), sizes


def _concat(parts: list[Any]) -> Any:
    first = parts[0]
    if isinstance(first, dict):
        return {key: _concat([p[key] for p in parts]) for key in first}
    if isinstance(first, np.ndarray):
        return np.concatenate(parts, axis=0)
    raise BatchingError(
        f"cannot batch {type(first).__name__} values from several shards; loop ports exchange numpy arrays"
        " or dicts of them when a worker serves more than one shard"
    )


def split(value: Any, sizes: list[int]) -> list[Any]:
    """`value` cut back into the shards it was computed for, `sizes` rows each: every array must have their sum."""
    if len(sizes) == 1:
        return [value]
    if isinstance(value, dict):
        per_key = {}
        for key, item in value.items():
            try:
                per_key[key] = split(item, sizes)
            except BatchingError as exc:
                raise BatchingError(f"[{key!r}]: {exc}") from None
        return [{key: per_key[key][i] for key in value} for i in range(len(sizes))]
    if isinstance(value, np.ndarray):
        rows = len(value) if value.ndim else 0
        if rows != sum(sizes):
            raise BatchingError(
                f"{rows} row(s), not the {sum(sizes)} of its input ({' + '.join(map(str, sizes))} by shard):"
                " one row per row given"
            )
        return np.split(value, np.cumsum(sizes)[:-1], axis=0)
    raise BatchingError(f"cannot split a {type(value).__name__} across shards; return numpy arrays or dicts of them")


def payload_bytes(value: Any) -> int:
    """Bytes of the arrays and tensors inside a (nested) dict/list value."""
    if isinstance(value, dict):
        return sum(payload_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(payload_bytes(v) for v in value)
    return int(getattr(value, "nbytes", 0))
