"""Checkpoints written atomically: a temporary directory renamed into place, loaded weights-only (tensors,
and numpy arrays: a simulator's state needs no torch in its process).

Workers may add their own files to the directory before it is renamed (`write_files`), e.g. a training
group's sharded `torch.distributed.checkpoint`; those files must be durable when `write_files` returns.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from m2flow.durable import write_durably

_PREFIX = "iter_"


def save_checkpoint(
    root: str | Path,
    iteration: int,
    state: dict[str, Any],
    meta: dict[str, Any],
    write_files: Callable[[Path], None] | None = None,
) -> Path:
    import torch

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{_PREFIX}{iteration:08d}"
    tmp = root / f".{final.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    if write_files is not None:
        write_files(tmp)
    write_durably(tmp / "state.pt", partial(torch.save, state))
    (tmp / "meta.json").write_text(json.dumps({"iteration": iteration, **meta}, indent=1))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    return final


def latest_checkpoint(root: str | Path) -> Path | None:
    root = Path(root)
    if not root.is_dir():
        return None
    done = [p for p in root.glob(f"{_PREFIX}*") if (p / "meta.json").exists() and (p / "state.pt").exists()]
    return max(done, key=lambda p: int(p.name.removeprefix(_PREFIX)), default=None)


def load_checkpoint(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    import torch

    path = Path(path)
    with torch.serialization.safe_globals(_numpy_globals()):
        state = torch.load(path / "state.pt", map_location="cpu", weights_only=True)
    return state, read_meta(path)


def read_meta(path: str | Path) -> dict[str, Any]:
    return json.loads((Path(path) / "meta.json").read_text())


def _numpy_globals() -> list[Any]:
    """What unpickling numpy arrays and scalars needs: plain data, no code."""
    import numpy as np

    try:
        from numpy._core.multiarray import _reconstruct, scalar
    except ImportError:  # numpy 1
        from numpy.core.multiarray import _reconstruct, scalar
    dtypes = [getattr(np.dtypes, name) for name in np.dtypes.__all__]
    return [np.ndarray, np.dtype, _reconstruct, scalar, *dtypes]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
