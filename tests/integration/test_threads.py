"""`resources.threads` on the real Ray cluster: the training worker's process runs on the cores and torch threads
declared (`auto`: all of its node's, as its only replica there)."""

from __future__ import annotations

import os

import pytest

import m2flow as mf
from m2flow.config import spec_from_dict
from tests.integration.test_loop import counter_workflow

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_cluster")]


@pytest.mark.parametrize("threads", [1, 2, "auto"])
def test_a_training_worker_is_pinned_to_its_cores_and_torch_computes_on_as_many_where_several(tmp_path, threads):
    raw = counter_workflow(tmp_path).to_dict()
    raw["workers"]["learner"]["class"] = "tests.workers_for_tests.CoresCollect"
    raw["workers"]["learner"]["resources"] = {"threads": threads}
    result = mf.run(spec_from_dict(raw))
    # auto: all of the node's slots (this machine's cores, its only replica), as this process may use them
    cores = min(os.cpu_count(), len(os.sched_getaffinity(0))) if threads == "auto" else threads
    assert result.last["cores"] == cores
    if cores > 1:
        assert result.last["torch_threads"] == cores
