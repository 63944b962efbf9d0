"""Channel receives over real Unix sockets: a peer that waits on another says so (beats), so its own waiters
outlast their silence bound; a peer that says nothing is taken as hung at that bound, not at the longest
wait; and beats do not stretch a wait past its most."""

from __future__ import annotations

import threading
import time

import pytest

from m2flow.errors import WaitTimeout
from m2flow.runtime.channels import Mailbox, Patience

SIMULATOR, POLICY, SILENT = ("env", 0), ("rollout", 0), ("env", 1)


@pytest.fixture
def mailboxes() -> dict[tuple, Mailbox]:
    """Three replicas, each connected to the other two."""
    boxes = {me: Mailbox(me, b"test", ["unix"]) for me in (SIMULATOR, POLICY, SILENT)}
    for me, box in boxes.items():
        for peer, other in boxes.items():
            if peer != me:
                box.connect(peer, other.addresses["unix"], timeout_s=10)
    for me, box in boxes.items():
        box.wait_inbound([p for p in boxes if p != me], timeout_s=10)
    return boxes


def policy_waiting_on_the_silent_simulator(box: Mailbox, seconds: float, then_send: bool) -> threading.Thread:
    """The policy waits `seconds` for a simulator that never sends, then (if asked) answers the other one."""

    def wait_then_answer():
        with pytest.raises(WaitTimeout):
            box.recv(SILENT, (0, 1, 0), Patience.fixed(seconds), "obs from env[1]")
        if then_send:
            box.send(SIMULATOR, (0, 2, 0), "action")

    thread = threading.Thread(target=wait_then_answer, daemon=True)
    thread.start()
    return thread


def test_a_peer_waiting_on_another_beats_so_its_waiter_outlasts_its_silence_bound(mailboxes):
    policy = policy_waiting_on_the_silent_simulator(mailboxes[POLICY], seconds=2.0, then_send=True)
    start = time.monotonic()
    got = mailboxes[SIMULATOR].recv(POLICY, (0, 2, 0), Patience(silent_s=1.5, most_s=10.0), "action")
    waited = time.monotonic() - start
    policy.join(timeout=10)

    assert got == "action"
    assert waited > 1.5  # longer than it may hear nothing: the policy's beats kept it waiting


def test_a_peer_that_says_nothing_is_hung_at_the_silence_bound_not_the_longest_wait(mailboxes):
    start = time.monotonic()
    with pytest.raises(WaitTimeout, match=r"no word from rollout\[0\] for"):
        mailboxes[SIMULATOR].recv(POLICY, (0, 2, 0), Patience(silent_s=0.5, most_s=60.0), "action")

    assert time.monotonic() - start < 30  # far below the 60 s it might have waited for a beating peer


def test_beats_do_not_stretch_a_wait_past_its_most(mailboxes):
    policy = policy_waiting_on_the_silent_simulator(mailboxes[POLICY], seconds=3.0, then_send=False)
    with pytest.raises(WaitTimeout, match=r"no data from rollout\[0\] for 2s, the most we may wait"):
        mailboxes[SIMULATOR].recv(POLICY, (0, 2, 0), Patience(silent_s=1.5, most_s=2.0), "action")
    policy.join(timeout=10)


def test_beats_left_unread_are_skipped_by_the_next_receive(mailboxes):
    policy = policy_waiting_on_the_silent_simulator(mailboxes[POLICY], seconds=1.0, then_send=False)
    policy.join(timeout=10)  # it beat to the simulator, which was not listening
    mailboxes[POLICY].send(SIMULATOR, (1, 2, 0), "next action")

    assert mailboxes[SIMULATOR].recv(POLICY, (1, 2, 0), Patience.fixed(5), "action") == "next action"
