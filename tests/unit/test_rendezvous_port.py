"""The port a process group's store listens on (`runtime/distributed.py` `free_port`): free when drawn, and outside
the kernel's ephemeral range, which outgoing connections take ports from between the draw and the listen (a
training worker restarted in place once failed to meet its group with EADDRINUSE)."""

from __future__ import annotations

import socket

import pytest

import m2flow.runtime.distributed as distributed
from m2flow.errors import WorkerError


def test_a_rendezvous_port_is_free_and_outside_the_kernels_ephemeral_range():
    low, high = distributed.ephemeral_range()
    ports = {distributed.free_port() for _ in range(50)}
    assert all(port >= distributed.LOWEST_PORT and not low <= port <= high for port in ports)
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("", port))


def test_with_no_port_outside_the_ephemeral_range_any_free_port_is_given(tmp_path, monkeypatch):
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text(f"{distributed.LOWEST_PORT}\t65535\n")
    monkeypatch.setattr(distributed, "EPHEMERAL", ranges)
    port = distributed.free_port()
    with socket.socket() as sock:
        sock.bind(("", port))


def test_an_unreadable_range_is_taken_as_linuxs_default(tmp_path, monkeypatch):
    monkeypatch.setattr(distributed, "EPHEMERAL", tmp_path / "missing")
    assert distributed.ephemeral_range() == (32768, 60999)


def test_a_store_port_taken_before_rank_0_listens_is_named_as_taken_not_as_a_peer_that_failed_to_start():
    """A sweep's camera run failed so: port 61452, drawn outside the ephemeral range and free when drawn, was bound
    by the time its group's store listened."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(WorkerError) as failed:
            distributed.meet("sync actor.weights -> env.evaluate", "127.0.0.1", port, 0, 2, 5.0)
    message = str(failed.value)
    assert f"could not host its process group's store at 127.0.0.1:{port}" in message
    assert "took the port after it was found free" in message and "fail to start" not in message
