"""A file written durably: on disk (flushed and fsynced) when the call returns, for the pieces of a checkpoint
that `m2flow.runtime.checkpoint` renames into place as a whole."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def write_durably(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """`write(file)` into `path`, then flush and fsync it."""
    with open(path, "wb") as fh:
        write(fh)
        fh.flush()
        os.fsync(fh.fileno())
