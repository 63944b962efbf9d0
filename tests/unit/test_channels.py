"""Channel receives over real Unix sockets, with every mailbox beating from a thread of its own: a peer that
waits on another, or works in a call, keeps its waiters waiting past their silence bound; a peer whose
process is stopped is taken as hung at that bound, not at the longest wait; one whose beats say a call has
run past its bound is hung then; beats do not stretch a wait past its most, nor mix into the data."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from m2flow.errors import WaitTimeout, WorkerError
from m2flow.runtime import pulse
from m2flow.runtime.channels import Mailbox, Patience, Unsendable

SIMULATOR, POLICY, SILENT = ("env", 0), ("rollout", 0), ("env", 1)
BEAT_EVERY_S = 0.1  # the tests' beat, to keep them short (a run's: channels.BEAT_EVERY_S)


@pytest.fixture
def mailboxes() -> Iterator[dict[tuple, Mailbox]]:
    """Three replicas, each connected to the other two."""
    boxes = {me: Mailbox(me, b"test", ["unix"], beat_every_s=BEAT_EVERY_S) for me in (SIMULATOR, POLICY, SILENT)}
    for me, box in boxes.items():
        for peer, other in boxes.items():
            if peer != me:
                box.connect(peer, other.addresses["unix"], timeout_s=10)
    for me, box in boxes.items():
        box.wait_inbound([p for p in boxes if p != me], timeout_s=10)
    yield boxes
    for box in boxes.values():
        box.close()


def in_thread(work) -> threading.Thread:
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread


def test_a_peer_that_waits_on_another_keeps_its_waiter_past_the_silence_bound(mailboxes):
    def policy_waits_then_answers():
        with pytest.raises(WaitTimeout):
            mailboxes[POLICY].recv(SILENT, (0, 1, 0), Patience.fixed(1.5), "obs from env[1]")
        mailboxes[POLICY].send(SIMULATOR, (0, 2, 0), "action")

    policy = in_thread(policy_waits_then_answers)
    start = time.monotonic()
    got = mailboxes[SIMULATOR].recv(POLICY, (0, 2, 0), Patience(silent_s=0.5, call_s=10.0, most_s=10.0), "action")
    waited = time.monotonic() - start
    policy.join(timeout=10)

    assert got == "action"
    assert waited > 1.0  # twice what it may hear nothing: the policy's beats kept it waiting


def test_a_peer_working_in_a_call_within_its_bound_keeps_its_waiter_past_the_silence_bound(mailboxes):
    def policy_acts_then_answers():
        with pulse.calling("rollout.act"):
            time.sleep(1.5)
        mailboxes[POLICY].send(SIMULATOR, (0, 2, 0), "action")

    policy = in_thread(policy_acts_then_answers)
    got = mailboxes[SIMULATOR].recv(POLICY, (0, 2, 0), Patience(silent_s=0.5, call_s=10.0, most_s=10.0), "action")
    policy.join(timeout=10)

    assert got == "action"


def test_a_peer_whose_beats_say_one_call_ran_past_its_bound_is_hung_then_named_with_its_port(mailboxes):
    def policy_acts_long():
        with pulse.calling("rollout.act"):
            time.sleep(3.0)

    policy = in_thread(policy_acts_long)
    in_call = r"rollout\[0\] has been in one call of rollout\.act for 1\.\ds, the most it may take"
    with pytest.raises(WaitTimeout, match=in_call):
        mailboxes[SIMULATOR].recv(POLICY, (0, 2, 0), Patience(silent_s=0.5, call_s=1.0, most_s=60.0), "action")
    policy.join(timeout=10)


def test_beats_do_not_stretch_a_wait_past_its_most_and_the_timeout_says_the_peer_is_in_a_call(mailboxes):
    def policy_acts_long():
        time.sleep(0.3)  # its call begins after the wait: the wait's own bound comes first
        with pulse.calling("rollout.act"):
            time.sleep(3.0)

    policy = in_thread(policy_acts_long)
    most = r"no data from rollout\[0\] for 1.5s, the most we may wait \(it has been in one call of rollout\.act for 1"
    with pytest.raises(WaitTimeout, match=most):
        mailboxes[SIMULATOR].recv(POLICY, (0, 2, 0), Patience(silent_s=0.5, call_s=1.5, most_s=1.5), "action")
    policy.join(timeout=10)


PEER = """
import ast, sys, time
from m2flow.runtime.channels import Mailbox
box = Mailbox(("rollout", 0), b"test", ["unix"], beat_every_s=0.1)
box.connect(("env", 0), ast.literal_eval(sys.argv[1]), timeout_s=10)
print("connected", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("stopped", [True, False])
def test_a_peer_process_that_is_stopped_is_hung_at_the_silence_bound_and_a_running_one_is_not(stopped):
    """The peer runs in a process of its own, its main thread asleep; stopped (SIGSTOP), it gives no beat."""
    box = Mailbox(SIMULATOR, b"test", ["unix"], beat_every_s=BEAT_EVERY_S)
    address = repr(box.addresses["unix"])  # an abstract address starts with a NUL, which argv cannot carry
    peer = subprocess.Popen([sys.executable, "-c", PEER, address], stdout=subprocess.PIPE, text=True)
    try:
        assert peer.stdout.readline().strip() == "connected"
        box.wait_inbound([POLICY], timeout_s=10)
        if stopped:
            os.kill(peer.pid, signal.SIGSTOP)
        start = time.monotonic()
        with pytest.raises(WaitTimeout) as raised:
            box.recv(POLICY, (0, 2, 0), Patience(silent_s=0.5, call_s=3.0, most_s=3.0), "action")
        waited = time.monotonic() - start
    finally:
        peer.kill()
        peer.wait()
        box.close()

    if stopped:
        assert "no word from rollout[0] for 0.5s (no data, no beat: its process is stopped" in str(raised.value)
        assert waited < 3.0
    else:
        assert "no data from rollout[0] for 3s, the most we may wait" in str(raised.value)
        assert waited >= 3.0


@pytest.mark.parametrize(("silent_s", "call_s", "most_s"), [(5.0, 1.0, 1.0), (1.0, 5.0, 2.0)])
def test_patience_refuses_a_silence_or_a_call_longer_than_the_whole_wait(silent_s, call_s, most_s):
    with pytest.raises(ValueError, match="0 < silent_s <= most_s and 0 < call_s <= most_s"):
        Patience(silent_s=silent_s, call_s=call_s, most_s=most_s)


def test_beats_left_unread_are_skipped_by_the_next_receive_even_one_that_said_a_call_ran_long(mailboxes):
    with pulse.calling("rollout.act"):
        time.sleep(1.0)  # beats pile up unread, the newest saying the call ran 0.9 s
    time.sleep(0.3)  # then some saying it is in no call
    mailboxes[POLICY].send(SIMULATOR, (1, 2, 0), "next action")

    assert mailboxes[SIMULATOR].recv(POLICY, (1, 2, 0), Patience(0.5, 0.5, 5), "action") == "next action"


def test_beats_from_the_beat_thread_never_mix_into_large_messages_sent_at_the_same_time():
    """A mailbox beating every millisecond while its main thread sends 40 messages of 4 MB on the same channel."""
    sender = Mailbox(POLICY, b"test", ["unix"], beat_every_s=0.001)
    receiver = Mailbox(SIMULATOR, b"test", ["unix"], beat_every_s=BEAT_EVERY_S)
    sender.connect(SIMULATOR, receiver.addresses["unix"], timeout_s=10)
    receiver.wait_inbound([POLICY], timeout_s=10)
    payloads = [np.full(1 << 20, float(i), np.float32) for i in range(40)]
    received: list[np.ndarray] = []

    def receive():
        for i in range(len(payloads)):
            received.append(receiver.recv(POLICY, (i, 2, 0), Patience.fixed(30), "action"))

    reader = in_thread(receive)
    for i, payload in enumerate(payloads):
        sender.send(SIMULATOR, (i, 2, 0), payload)
    reader.join(timeout=60)
    sender.close()
    receiver.close()

    assert len(received) == len(payloads)
    assert all(np.array_equal(got, sent) for got, sent in zip(received, payloads, strict=True))


def test_closing_a_mailbox_ends_its_beat_thread():
    before = set(threading.enumerate())
    boxes = [Mailbox(me, b"test", ["unix"], beat_every_s=0.01) for me in (SIMULATOR, POLICY)]
    boxes[0].connect(POLICY, boxes[1].addresses["unix"], timeout_s=10)
    boxes[1].wait_inbound([SIMULATOR], timeout_s=10)
    time.sleep(0.1)  # beating, a beat every 10 ms
    beats = {t for t in set(threading.enumerate()) - before if t.name == "m2flow-beat"}
    for box in boxes:
        box.close()

    assert len(beats) == 2 and not any(thread.is_alive() for thread in beats)


def test_arrived_says_whether_the_next_message_is_here_without_waiting_and_keeps_what_it_read(mailboxes):
    simulator, policy = mailboxes[SIMULATOR], mailboxes[POLICY]
    time.sleep(3 * BEAT_EVERY_S)  # beats queued ahead of the data are read past
    assert not policy.arrived(SIMULATOR, (0, 1, 0))
    simulator.send(POLICY, (0, 1, 0), "slice 0")
    simulator.send(POLICY, (0, 1, 1), "slice 1")
    deadline = time.monotonic() + 10
    while not policy.arrived(SIMULATOR, (0, 1, 0)):
        assert time.monotonic() < deadline, "a message sent never arrived"
    assert not policy.arrived(SIMULATOR, (0, 1, 1))  # not the next one: slice 0 comes first
    assert policy.recv(SIMULATOR, (0, 1, 0), Patience.fixed(5), "slice 0") == "slice 0"
    while not policy.arrived(SIMULATOR, (0, 1, 1)):
        assert time.monotonic() < deadline, "a message sent never arrived"
    assert policy.recv(SIMULATOR, (0, 1, 1), Patience.fixed(5), "slice 1") == "slice 1"


def test_a_message_sent_before_its_channel_closed_has_arrived_and_the_receive_after_it_reports_the_close(mailboxes):
    mailboxes[SILENT].send(POLICY, (0, 1, 0), "last words")
    mailboxes[SILENT].close()
    assert mailboxes[POLICY].arrived(SILENT, (0, 1, 0))
    assert not mailboxes[POLICY].arrived(SILENT, (0, 1, 1))  # the message read is another's; nothing after it
    assert mailboxes[POLICY].recv(SILENT, (0, 1, 0), Patience.fixed(5), "obs from env[1]") == "last words"
    assert not mailboxes[POLICY].arrived(SILENT, (0, 1, 1))  # closed: no, and the receive says why
    with pytest.raises(WorkerError, match="closed its channel"):
        mailboxes[POLICY].recv(SILENT, (0, 1, 1), Patience.fixed(5), "obs from env[1]")


def test_a_payload_pickle_cannot_send_is_refused_before_the_channel_is_touched():
    box = Mailbox(SIMULATOR, b"test", ["unix"], beat_every_s=BEAT_EVERY_S)
    try:
        with pytest.raises(Unsendable, match=r"cannot be sent to another process \(TypeError: cannot pickle"):
            box.send(POLICY, (0, 1, 0), {"obs": np.zeros(2), "lock": threading.Lock()})  # POLICY: never connected
        assert box.sent_bytes == 0
    finally:
        box.close()


def test_a_unix_channel_leaves_no_file_behind_even_when_its_process_is_killed():
    """Same-node channels listen at an abstract address: a replica killed without closing its mailbox (as a lost
    or replaced one is) leaves nothing in the temporary folder, where a socket file and its folder were left once
    per replica and run."""
    before = set(os.listdir(tempfile.gettempdir()))
    box = Mailbox(SIMULATOR, b"test", ["unix"], beat_every_s=BEAT_EVERY_S)
    address = box.addresses["unix"]
    peer = subprocess.Popen([sys.executable, "-c", PEER, repr(address)], stdout=subprocess.PIPE, text=True)
    try:
        assert peer.stdout.readline().strip() == "connected"
        box.wait_inbound([POLICY], timeout_s=10)
    finally:
        peer.kill()  # the peer's own listener is never closed
        peer.wait()
        box.close()
    assert address.startswith(b"\0m2flow-env-0-")  # what the listener reports: the bytes of an abstract address
    assert not {name for name in set(os.listdir(tempfile.gettempdir())) - before if name.startswith("m2f")}
