"""Host arrays onto a policy's device: observations in, exploration noise in.

On CUDA an array goes through page-locked (pinned) memory with a non-blocking copy: the host thread goes
on queueing the forward's kernels while the copy runs, where a copy from pageable memory would hold it
until the driver had staged every byte. Pinned blocks come from torch's caching host allocator, which
reuses a block only once the copies that read it are done, and keeps it for the process's life. So only
arrays up to `PINNED_MAX_BYTES` (an observation batch an act call reads) go through it; a larger one (a whole
trajectory a training update reads) and any array where pinning fails (a container's locked-memory limit,
say) take the ordinary synchronous copy. Elsewhere the tensor is a copy of the array on the device.
"""

from __future__ import annotations

import numpy as np
import torch

PINNED_MAX_BYTES = 64 * 2**20


def from_host(array: np.ndarray, device: torch.device, dtype: np.dtype | None = None) -> torch.Tensor:
    """`array` (as `dtype`, if given) as a tensor of its own on `device`."""
    array = np.asarray(array, dtype=dtype)
    if device.type != "cuda" or array.nbytes > PINNED_MAX_BYTES:
        return torch.tensor(array, device=device)
    try:
        pinned = torch.empty(array.shape, dtype=_torch_dtype(array.dtype), pin_memory=True)
    except RuntimeError:  # no page-locked memory to be had: the synchronous copy
        return torch.tensor(array, device=device)
    pinned.numpy()[...] = array
    return pinned.to(device, non_blocking=True)


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype
