"""A policy's state, sized without allocating it (`sizes.state_size`, `hf_folder.folder_size`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StateSize:
    """A policy's state, sized without allocating it."""

    bytes: int  # parameters and buffers, in the dtypes they load in
    trainable: int  # how many parameters training changes (all, or with LoRA the adapters and heads)
    trainable_bytes: int  # those, in the dtypes they load in
