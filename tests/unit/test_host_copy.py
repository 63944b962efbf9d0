"""Host arrays onto a policy's device (`from_host`): on the CPU a tensor of its own in the dtype asked; the
pinned, non-blocking CUDA path is tested in test_cuda.py."""

from __future__ import annotations

import warnings

import numpy as np
import torch

from m2flow.workers.models.host_copy import from_host

CPU = torch.device("cpu")


def test_a_host_array_becomes_a_tensor_of_its_own_in_the_dtype_asked():
    array = np.arange(6, dtype=np.float64).reshape(2, 3)
    tensor = from_host(array, CPU, np.float32)
    assert tensor.dtype == torch.float32
    assert torch.equal(tensor, torch.arange(6, dtype=torch.float32).reshape(2, 3))
    array[0, 0] = 99.0
    assert tensor[0, 0] == 0.0


def test_a_read_only_array_as_the_object_store_hands_it_over_converts_without_a_warning():
    array = np.full((4, 2, 3), 7, dtype=np.uint8)
    array.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tensor = from_host(array, CPU)
    assert tensor.dtype == torch.uint8 and tensor.shape == (4, 2, 3) and int(tensor.sum()) == 7 * 24


def test_a_sliced_view_keeps_its_values():
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    tensor = from_host(images[:, :1], CPU)
    assert torch.equal(tensor, torch.from_numpy(images[:, :1].copy()))
