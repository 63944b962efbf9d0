"""A local Ray that m2flow starts runs its workers at the user's priority (Ray's default is nice 15)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.integration

PROBE = """
import os, ray
from m2flow.runtime.ray_cluster import connect_ray
from m2flow.spec import ClusterSpec
connect_ray(ClusterSpec(cpus=1, gpus=0))
print("worker niceness", ray.get(ray.remote(lambda: os.nice(0)).remote()), "driver", os.nice(0))
ray.shutdown()
"""


@pytest.mark.skipif(os.nice(0) > 4, reason="at nice > 4 Ray's +15 is capped at 19 too: the test could not fail")
def test_workers_of_a_local_cluster_run_at_the_drivers_niceness():
    env = {k: v for k, v in os.environ.items() if k != "RAY_worker_niceness"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ROOT, timeout=120, env=env, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(line for line in out.stdout.splitlines() if line.startswith("worker niceness"))
    _, _, worker, _, driver = line.split()
    assert int(worker) == int(driver), line
