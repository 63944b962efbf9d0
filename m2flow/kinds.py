"""What each worker kind means to the engine, in one registry (never `if kind == ...` across files)."""

from __future__ import annotations

from dataclasses import dataclass

from m2flow.spec import Dispatch


@dataclass(frozen=True)
class KindTraits:
    dispatch: Dispatch  # how its ports split inputs and gather outputs unless a port says otherwise
    group: bool  # its replicas are the ranks of one torch.distributed group: one checkpoint, rank 0 speaks
    accelerator: bool  # `resources.device: auto` puts it on a GPU when the cluster has one
    slices: bool  # a replica hosts one instance per pipeline slice of the loop batch
    renders: bool = False  # renders cameras on a GPU of its node where it has one (`planners/render.py`)


KINDS: dict[str, KindTraits] = {
    "simulator": KindTraits(Dispatch(), group=False, accelerator=False, slices=True, renders=True),
    "inference": KindTraits(Dispatch(), group=False, accelerator=True, slices=False),
    "training": KindTraits(Dispatch(split="shard", gather="rank_zero"), group=True, accelerator=True, slices=False),
    "buffer": KindTraits(Dispatch(), group=False, accelerator=False, slices=False),  # replay: host memory
    "function": KindTraits(Dispatch(), group=False, accelerator=False, slices=False),
}
