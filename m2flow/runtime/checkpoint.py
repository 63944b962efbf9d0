"""Checkpoints written atomically: a temporary directory renamed into place, loaded weights-only (tensors,
and numpy arrays: a simulator's state needs no torch in its process).

Workers may add their own files to the directory before it is renamed (`write_files`), e.g. a training
group's sharded `torch.distributed.checkpoint`; those files must be durable when `write_files` returns.
The state is loaded back before anything is written: a worker's `state_dict()` holding what a weights-only load
refuses (an object of its own class, a function) is named then, not when a resume cannot read any checkpoint.
A checkpoint that replaces one of the same iteration keeps the old one until the new one is in place (set aside as
`.iter_N.old`, put back where a kill left it there).
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from m2flow.durable import write_durably
from m2flow.errors import CheckpointError

_PREFIX = "iter_"


def save_checkpoint(
    root: str | Path,
    iteration: int,
    state: dict[str, Any],
    meta: dict[str, Any],
    write_files: Callable[[Path], None] | None = None,
) -> Path:
    saved = _loadable_bytes(state)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{_PREFIX}{iteration:08d}"
    tmp, old = root / f".{final.name}.tmp", root / f".{final.name}.old"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    if write_files is not None:
        write_files(tmp)
    write_durably(tmp / "state.pt", lambda fh: fh.write(saved))
    (tmp / "meta.json").write_text(json.dumps({"iteration": iteration, **meta}, indent=1))
    if final.exists():  # kept, as a name no reader takes, until the new one is in place
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync_dir(root)
    shutil.rmtree(old, ignore_errors=True)
    return final


def _loadable_bytes(state: dict[str, Any]) -> bytes:
    """`state` as torch.save writes it, once a weights-only load has read it back; else a CheckpointError naming the
    worker whose state cannot be saved or loaded so."""
    try:
        saved = _saved(state)
        _load(io.BytesIO(saved))
        return saved
    except Exception as exc:  # noqa: BLE001 - pickling and unpickling raise many kinds; the worker is named below
        for worker, part in state.items():
            try:
                _load(io.BytesIO(_saved({worker: part})))
            except Exception as own:  # noqa: BLE001
                raise CheckpointError(
                    f"a checkpoint cannot hold the state_dict() of worker '{worker}': {_reason(own)}; return"
                    " tensors, numpy arrays and plain Python values (numbers, strings, lists, dicts), which a"
                    " weights-only load reads back"
                ) from None
        raise CheckpointError(f"a checkpoint cannot be written: {_reason(exc)}") from None


def _saved(state: dict[str, Any]) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def _load(source: io.BytesIO | Path) -> dict[str, Any]:
    import torch

    with torch.serialization.safe_globals(_numpy_globals()):
        return torch.load(source, map_location="cpu", weights_only=True)


def _reason(exc: Exception) -> str:
    """What a (un)pickling error says was refused: the global a weights-only load does not take (its advice to
    allowlist it is for the loader's author), else the error's last line."""
    refused = re.search(r"Unsupported global: GLOBAL (\S+)", str(exc))
    if refused:
        return f"a weights-only load refuses the global {refused.group(1)}"
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[-1] if lines else ''}"


def latest_checkpoint(root: str | Path) -> Path | None:
    root = Path(root)
    if not root.is_dir():
        return None
    return max(_done(root), key=_iteration, default=None)


def _done(root: Path) -> list[Path]:
    """The checkpoints under `root` that were renamed into place, oldest first; one a kill left set aside as it was
    being replaced (`.iter_N.old` without `iter_N`) is put back first."""
    for old in root.glob(f".{_PREFIX}*.old"):
        final = root / old.name.removeprefix(".").removesuffix(".old")
        if not final.exists():
            os.replace(old, final)
    done = [p for p in root.glob(f"{_PREFIX}*") if (p / "meta.json").exists() and (p / "state.pt").exists()]
    return sorted(done, key=_iteration)


def _iteration(checkpoint: Path) -> int:
    return int(checkpoint.name.removeprefix(_PREFIX))


def load_checkpoint(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    path = Path(path)
    try:
        state = _load(path / "state.pt")
    except Exception as exc:  # noqa: BLE001 - a damaged file fails in the zip reader, the unpickler or torch
        earlier = [p.name for p in _done(path.parent) if _iteration(p) < _iteration(path)]
        before = f"the checkpoint before it ({earlier[-1]})" if earlier else "the start (no checkpoint is before it)"
        raise CheckpointError(
            f"checkpoint {path}: its state.pt cannot be read ({_reason(exc)}): it is damaged; remove that folder to go"
            f" on from {before}"
        ) from None
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
