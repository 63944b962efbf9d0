"""Channel receives over real Unix sockets: a process beats while in the loop (its pulse), so a peer that
waits on another, or works in a call, keeps its waiters waiting past their silence bound; a peer that says
nothing is taken as hung at that bound, not at the longest wait; one whose beats say a call has run past
its bound is hung then; beats do not stretch a wait past its most, nor mix into the data on a channel."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from m2flow.errors import WaitTimeout
from m2flow.runtime.channels import Mailbox, Patience
from m2flow.runtime.pulse import Pulse

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


def policy_waiting_on_the_silent_simulator(
    box: Mailbox, seconds: float, then_send: bool, pulse: Pulse
) -> threading.Thread:
    """The policy, its process pulsing, waits `seconds` for a simulator that never sends, then (if asked)
    answers the other one."""

    def wait_then_answer():
        with pulse, pytest.raises(WaitTimeout):
            box.recv(SILENT, (0, 1, 0), Patience.fixed(seconds), "obs from env[1]")
        if then_send:
            box.send(SIMULATOR, (0, 2, 0), "action")

    thread = threading.Thread(target=wait_then_answer, daemon=True)
    thread.start()
    return thread


def test_a_peer_whose_process_pulses_while_it_waits_on_another_keeps_its_waiter_past_the_silence_bound(mailboxes):
    policy = policy_waiting_on_the_silent_simulator(
        mailboxes[POLICY], seconds=2.0, then_send=True, pulse=Pulse([mailboxes[POLICY]], silence_s=1.5)
    )
    start = time.monotonic()
    got = mailboxes[SIMULATOR].recv(POLICY, (0, 2, 0), Patience(silent_s=1.5, call_s=10.0, most_s=10.0), "action")
    waited = time.monotonic() - start
    policy.join(timeout=10)

    assert got == "action"
    assert waited > 1.5  # longer than it may hear nothing: the policy's beats kept it waiting


def test_a_peer_that_says_nothing_is_hung_at_the_silence_bound_not_the_longest_wait(mailboxes):
    start = time.monotonic()
    with pytest.raises(WaitTimeout, match=r"no word from rollout\[0\] for 0.5s \(no data, no beat: stopped"):
        mailboxes[SIMULATOR].recv(POLICY, (0, 2, 0), Patience(silent_s=0.5, call_s=60.0, most_s=60.0), "action")

    assert time.monotonic() - start < 5  # far below the 60 s it might have waited for a beating peer


def test_beats_do_not_stretch_a_wait_past_its_most(mailboxes):
    policy = policy_waiting_on_the_silent_simulator(
        mailboxes[POLICY], seconds=3.0, then_send=False, pulse=Pulse([mailboxes[POLICY]], silence_s=1.5)
    )
    with pytest.raises(WaitTimeout, match=r"no data from rollout\[0\] for 2s, the most we may wait"):
        mailboxes[SIMULATOR].recv(POLICY, (0, 2, 0), Patience(silent_s=1.5, call_s=2.0, most_s=2.0), "action")
    policy.join(timeout=10)


def policy_in_one_call(box: Mailbox, seconds: float, silence_s: float) -> threading.Thread:
    """The policy works in one call for `seconds` (its process pulsing), then sends its action."""

    def act_then_send():
        pulse = Pulse([box], silence_s=silence_s)
        with pulse, pulse.calling():
            time.sleep(seconds)
        box.send(SIMULATOR, (0, 2, 0), "action")

    thread = threading.Thread(target=act_then_send, daemon=True)
    thread.start()
    return thread


def test_a_peer_working_in_a_call_within_its_bound_keeps_its_waiter_past_the_silence_bound(mailboxes):
    policy = policy_in_one_call(mailboxes[POLICY], seconds=1.5, silence_s=0.6)
    got = mailboxes[SIMULATOR].recv(POLICY, (0, 2, 0), Patience(silent_s=0.6, call_s=10.0, most_s=10.0), "action")
    policy.join(timeout=10)

    assert got == "action"


def test_a_peer_whose_beats_say_one_call_ran_past_its_bound_is_hung_then_not_at_the_longest_wait(mailboxes):
    policy = policy_in_one_call(mailboxes[POLICY], seconds=3.0, silence_s=0.4)
    start = time.monotonic()
    with pytest.raises(WaitTimeout, match=r"rollout\[0\] has been in one call for 1\.\ds, over the 1s it may take"):
        mailboxes[SIMULATOR].recv(POLICY, (0, 2, 0), Patience(silent_s=0.4, call_s=1.0, most_s=60.0), "action")
    waited = time.monotonic() - start
    policy.join(timeout=10)

    assert 1.0 <= waited < 2.5


def test_a_replica_whose_process_mate_waits_is_kept_alive_by_the_pulse_of_their_process(mailboxes):
    """The policy and the silent simulator share a process: while the policy waits, its process mate beats too."""
    policy, mate = mailboxes[POLICY], mailboxes[SILENT]

    def policy_waits_then_its_mate_answers():
        with Pulse([policy, mate], silence_s=1.5), pytest.raises(WaitTimeout):
            policy.recv(SIMULATOR, (0, 1, 0), Patience.fixed(2.0), "obs from env[0]")
        mate.send(SIMULATOR, (0, 2, 0), "from the mate")

    thread = threading.Thread(target=policy_waits_then_its_mate_answers, daemon=True)
    thread.start()
    patience = Patience(silent_s=1.5, call_s=10.0, most_s=10.0)
    got = mailboxes[SIMULATOR].recv(SILENT, (0, 2, 0), patience, "from the mate")
    thread.join(timeout=10)

    assert got == "from the mate"


@pytest.mark.parametrize(("silent_s", "call_s", "most_s"), [(5.0, 1.0, 1.0), (1.0, 5.0, 2.0)])
def test_patience_refuses_a_silence_or_a_call_longer_than_the_whole_wait(silent_s, call_s, most_s):
    with pytest.raises(ValueError, match="0 < silent_s <= most_s and 0 < call_s <= most_s"):
        Patience(silent_s=silent_s, call_s=call_s, most_s=most_s)


def test_beats_left_unread_are_skipped_by_the_next_receive(mailboxes):
    policy = policy_waiting_on_the_silent_simulator(
        mailboxes[POLICY], seconds=1.0, then_send=False, pulse=Pulse([mailboxes[POLICY]], silence_s=0.2)
    )
    policy.join(timeout=10)  # its process beat to the simulator, which was not listening
    mailboxes[POLICY].send(SIMULATOR, (1, 2, 0), "next action")

    assert mailboxes[SIMULATOR].recv(POLICY, (1, 2, 0), Patience.fixed(5), "action") == "next action"


def test_beats_from_the_pulse_thread_never_mix_into_large_messages_sent_at_the_same_time(mailboxes):
    """The pulse beats every 5 ms while the main thread sends 40 messages of 4 MB on the same channel."""
    payloads = [np.full(1 << 20, float(i), np.float32) for i in range(40)]
    received: list[np.ndarray] = []

    def receive():
        for i in range(len(payloads)):
            received.append(mailboxes[SIMULATOR].recv(POLICY, (i, 2, 0), Patience.fixed(30), "action"))

    reader = threading.Thread(target=receive, daemon=True)
    reader.start()
    with Pulse([mailboxes[POLICY]], silence_s=0.02):
        for i, payload in enumerate(payloads):
            mailboxes[POLICY].send(SIMULATOR, (i, 2, 0), payload)
    reader.join(timeout=60)

    assert len(received) == len(payloads)
    assert all(np.array_equal(got, sent) for got, sent in zip(received, payloads, strict=True))
