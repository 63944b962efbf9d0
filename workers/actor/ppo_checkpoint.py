"""A PPO training worker's checkpoint folder: `shards/`, every rank's part of the model and optimizer in the
plain layout's names (torch.distributed.checkpoint, so it reloads at another world size or backend), and
`progress.pt`, rank 0's record of the run's progress (generator, weights version, updates, reward scaler).
Torch is imported where it runs."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

from m2flow.durable import write_durably


def write(root: Path, sharded_state: dict[str, Any], progress: dict[str, Any] | None) -> None:
    """Every rank writes its shards; the rank that holds the `progress` (rank 0) writes it too."""
    import torch
    import torch.distributed.checkpoint as dcp

    root.mkdir(parents=True, exist_ok=True)
    with _single_process_is_fine():
        dcp.save(sharded_state, checkpoint_id=root / "shards")
    if progress is not None:
        write_durably(root / "progress.pt", partial(torch.save, progress))


def read_into(root: Path, state: dict[str, Any]) -> dict[str, Any]:
    """Fill `state` (this run's sharded layout, {"model", "optimizer"}) from the shards; returns the progress.
    Parameters that never had a gradient (an unused layer of a loaded model) have no optimizer state."""
    import torch
    import torch.distributed.checkpoint as dcp

    saved = dcp.FileSystemReader(str(root / "shards")).read_metadata().state_dict_metadata
    stepped = {
        key.removeprefix("optimizer.state.").rsplit(".", 1)[0] for key in saved if key.startswith("optimizer.state.")
    }
    state["optimizer"]["state"] = {p: s for p, s in state["optimizer"]["state"].items() if p in stepped}
    with _single_process_is_fine():
        dcp.load(state, checkpoint_id=root / "shards")
    return torch.load(root / "progress.pt", map_location="cpu", weights_only=True)


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """A training worker's checkpoint folder as whole tensors in one process (no process group):
    {"model": ..., "optimizer": ..., "progress": ...} — to evaluate or inspect a policy offline."""
    import tempfile

    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    root = Path(path)
    with tempfile.TemporaryDirectory() as tmp:
        dcp_to_torch_save(root / "shards", Path(tmp) / "state.pt")
        state = torch.load(Path(tmp) / "state.pt", map_location="cpu", weights_only=False)
    state["progress"] = torch.load(root / "progress.pt", map_location="cpu", weights_only=True)
    return state


@contextlib.contextmanager
def _single_process_is_fine() -> Iterator[None]:
    """A rank without a process group writes and reads its checkpoint alone, as intended: no warning."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield
