"""Channel receives over real Unix sockets: a peer that waits on another says so (beats), so its own waiters
outlast their silence bound; a peer that says nothing is taken as hung at that bound, not at the longest
wait; and beats do not stretch a wait past its most."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from m2flow.errors import WaitTimeout
from m2flow.runtime.channels import Mailbox, Patience

SIMULATOR, POLICY, SILENT = ("env", 0), ("rollout", 0), ("env", 1)


@pytest.fixture
def mailboxes() -> Iterator[dict[tuple, Mailbox]]:
    """Three replicas, each connected to the other two."""
    boxes = {me: Mailbox(me, b"test", ["unix"]) for me in (SIMULATOR, POLICY, SILENT)}
    for me, box in boxes.items():
        for peer, other in boxes.items():
            if peer != me:
                box.connect(peer, other.addresses["unix"], timeout_s=10)
    for me, box in boxes.items():
        box.wait_inbound([p for p in boxes if p != me], timeout_s=10)
    yield boxes
    for box in boxes.values():
        box.close()


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

    assert time.monotonic() - start < 5  # far below the 60 s it might have waited for a beating peer


def test_beats_do_not_stretch_a_wait_past_its_most(mailboxes):
    policy = policy_waiting_on_the_silent_simulator(mailboxes[POLICY], seconds=3.0, then_send=False)
    with pytest.raises(WaitTimeout, match=r"no data from rollout\[0\] for 2s, the most we may wait"):
        mailboxes[SIMULATOR].recv(POLICY, (0, 2, 0), Patience(silent_s=1.5, most_s=2.0), "action")
    policy.join(timeout=10)


def test_a_replica_whose_process_mate_waits_is_kept_alive_by_the_beats_of_their_process(mailboxes):
    """The policy and the silent simulator share a process: while the policy waits, its process mate beats too."""
    policy, mate = mailboxes[POLICY], mailboxes[SILENT]

    def policy_waits_then_its_mate_answers():
        with pytest.raises(WaitTimeout):
            policy.recv(SIMULATOR, (0, 1, 0), Patience.fixed(2.0), "obs from env[0]", beat=both_beat)
        mate.send(SIMULATOR, (0, 2, 0), "from the mate")

    def both_beat():
        policy.beat()
        mate.beat()

    thread = threading.Thread(target=policy_waits_then_its_mate_answers, daemon=True)
    thread.start()
    got = mailboxes[SIMULATOR].recv(SILENT, (0, 2, 0), Patience(silent_s=1.5, most_s=10.0), "from the mate")
    thread.join(timeout=10)

    assert got == "from the mate"


def test_patience_refuses_a_silence_longer_than_the_whole_wait():
    with pytest.raises(ValueError, match="0 < silent_s <= most_s"):
        Patience(silent_s=5.0, most_s=1.0)


def test_beats_left_unread_are_skipped_by_the_next_receive(mailboxes):
    policy = policy_waiting_on_the_silent_simulator(mailboxes[POLICY], seconds=1.0, then_send=False)
    policy.join(timeout=10)  # it beat to the simulator, which was not listening
    mailboxes[POLICY].send(SIMULATOR, (1, 2, 0), "next action")

    assert mailboxes[SIMULATOR].recv(POLICY, (1, 2, 0), Patience.fixed(5), "action") == "next action"
