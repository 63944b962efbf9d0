"""Asking ranks where they are through a task on their Ray node (how the controller asks ranks on another
host): a running process answers with its stack, a pid that is no longer the process started for it is
not signalled, and a node that cannot run the task leaves its ranks unasked."""

from __future__ import annotations

import subprocess
import sys

import psutil
import pytest

from m2flow.runtime.stacks import RankState, ask_on_node
from tests.unit.test_stacks import WAITING

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_cluster")]


def test_ranks_are_asked_on_their_node_and_a_reused_pid_is_not_signalled(tmp_path):
    import ray

    address = ray.util.get_node_ip_address()  # as the task on the node names the answer files it reads
    proc = subprocess.Popen([sys.executable, "-c", WAITING, str(tmp_path), address], stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == b"ready"
        started = psutil.Process(proc.pid).create_time()
        node = ray.get_runtime_context().get_node_id()
        ranks = {"w[0]": (proc.pid, started), "w[1]": (proc.pid, started - 1.0)}  # w[1]: its pid taken since

        running, reused = ask_on_node(node, ranks, str(tmp_path))
    finally:
        proc.kill()
    assert running.rank == "w[0]" and running.arrived is False
    assert running.where.startswith("not in a collective: at waiting_for_a_peer (")
    assert reused == RankState("w[1]", None, "its process is gone")


def test_a_node_that_cannot_run_the_question_leaves_its_ranks_unasked(tmp_path):
    (state,) = ask_on_node("ab" * 28, {"w[0]": (1, 0.0)}, str(tmp_path))  # no such node

    assert state.rank == "w[0]" and state.arrived is None and state.where.endswith(": not asked")
