"""Where m2flow writes: a folder made before any work that would be lost if it could not be (a run's outputs, a
profile), and a file written durably — on disk (flushed and fsynced) when the call returns, for the pieces of a
checkpoint that `m2flow.runtime.checkpoint` renames into place as a whole."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from m2flow.errors import SpecError


def output_folder(path: str | Path, key: str) -> Path:
    """`path`, made with its parents and writable, or a SpecError that names `key`, where the user chose it."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecError(
            [f"{key}: cannot make the folder {path}: {exc.strerror}; choose a folder you can write"]
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise SpecError([f"{key}: the folder {path} is not writable; choose a folder you can write"])
    return path


def write_durably(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """`write(file)` into `path`, then flush and fsync it."""
    with open(path, "wb") as fh:
        write(fh)
        fh.flush()
        os.fsync(fh.fileno())
