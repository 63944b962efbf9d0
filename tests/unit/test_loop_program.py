"""The loop program's tolerance of a failed replica, without Ray: an inference replica whose channel from
a droppable simulator replica breaks goes on with the other shards and reports it; one that is not
droppable fails the loop as before; a simulator whose droppable inference peer breaks stops naming it."""

from __future__ import annotations

import numpy as np
import pytest

from m2flow.errors import WorkerError
from m2flow.runtime.loop import LoopProgram, Member, PeerLost, run_loop

ENVS_PER_SHARD, HORIZON, BREAKS_AT = 2, 6, 3


class Mailbox:
    """Channels to two simulator replicas; the one to env[1] breaks at step BREAKS_AT."""

    sent_bytes = 0

    def __init__(self):
        self.sent: list[tuple] = []

    def recv(self, peer, header, patience, waiting_for):
        step = header[0]
        if peer == ("env", 1) and step >= BREAKS_AT:
            raise WorkerError("rollout[0]: env[1] closed its channel (it crashed or was killed)")
        return {peer[1]: np.full((ENVS_PER_SHARD, 3), float(peer[1]), np.float32)}

    def send(self, peer, header, payload):
        self.sent.append((peer, header[0], sorted(payload)))
        return 1


def program(
    droppable: frozenset[tuple[str, int]], simulators: int = 2, stages: int = 1, merge: frozenset[int] = frozenset()
) -> LoopProgram:
    return LoopProgram(
        ports=(("env", "obs"), ("rollout", "act"), ("env", "step")),
        horizon=HORIZON,
        stages=stages,
        shards=simulators,
        replicas={"env": simulators, "rollout": 1},
        iteration=0,
        channel_timeout_s=1.0,
        silence_s=1.0,
        trace_steps=False,
        droppable=droppable,
        merge_slices=merge,
    )


def rollout(mailbox: Mailbox, acted: list[np.ndarray]) -> Member:
    def act(port, stage, obs):
        acted.append(obs)
        return obs

    return Member("rollout", 0, act, mailbox)


def test_a_droppable_simulator_whose_channel_breaks_is_dropped_and_the_others_go_on():
    mailbox, acted = Mailbox(), []
    (stats,) = run_loop(program(frozenset({("env", 1)})), [rollout(mailbox, acted)])

    assert list(stats.lost) == [1] and "closed its channel" in stats.lost[1].why
    assert len(acted) == HORIZON  # every step acted, on both shards until the break, then on env[0]'s
    assert [len(obs) for obs in acted] == [2 * ENVS_PER_SHARD] * BREAKS_AT + [ENVS_PER_SHARD] * (HORIZON - BREAKS_AT)
    assert stats.items["act"] == ENVS_PER_SHARD * (BREAKS_AT * 2 + HORIZON - BREAKS_AT)
    assert {step for peer, step, _ in mailbox.sent if peer == ("env", 1)} == set(range(BREAKS_AT))
    assert {step for peer, step, _ in mailbox.sent if peer == ("env", 0)} == set(range(HORIZON))


def test_a_simulator_that_may_not_be_dropped_fails_the_loop():
    with pytest.raises(WorkerError, match="env\\[1\\] closed its channel"):
        run_loop(program(frozenset()), [rollout(Mailbox(), [])])


class PolicyMailbox:
    """A simulator's channel to its policy, which breaks at step BREAKS_AT."""

    sent_bytes = 0

    def recv(self, peer, header, patience, waiting_for):
        if header[0] >= BREAKS_AT:
            raise WorkerError("env[0]: rollout[0] closed its channel (it crashed or was killed)")
        return {0: np.zeros((ENVS_PER_SHARD, 1), np.float32)}

    def send(self, peer, header, payload):
        return 1


def simulator(stepped: list[int]) -> Member:
    def call(port, stage, value):
        stepped.append(port)
        return np.zeros((ENVS_PER_SHARD, 3), np.float32)

    return Member("env", 0, call, PolicyMailbox())


@pytest.mark.parametrize("policy_droppable", [True, False])
def test_a_simulator_whose_policy_breaks_stops_naming_it_when_it_may_be_replaced(policy_droppable):
    droppable = frozenset({("env", 0), ("env", 1), *([("rollout", 0)] if policy_droppable else [])})
    stepped: list[str] = []
    with pytest.raises(WorkerError, match="rollout\\[0\\] closed its channel") as raised:
        run_loop(program(droppable), [simulator(stepped)])

    assert isinstance(raised.value, PeerLost) == policy_droppable
    if policy_droppable:
        assert raised.value.peer == ("rollout", 0)
    assert stepped == ["obs"] + ["step"] * BREAKS_AT  # it stopped at the break, its envs no further


class SlicesMailbox:
    """Channels to three simulator replicas, each sending one env a slice (its replica index as the rows'
    value); `late` lists the (peer, step, slice) whose message has not arrived when the policy first looks, and
    the channel to `breaks`, if any, breaks as the policy sends to it at step BREAKS_AT."""

    sent_bytes = 0

    def __init__(self, late: frozenset[tuple[int, int, int]] = frozenset(), breaks: int | None = None):
        self.late, self.breaks = late, breaks
        self.sent: list[tuple[int, int, int, dict]] = []  # (peer, step, slice, payload)

    def arrived(self, peer, header):
        return (peer[1], header[0], header[2]) not in self.late

    def recv(self, peer, header, patience, waiting_for):
        return {peer[1]: np.full((1, 3), float(peer[1]), np.float32)}

    def send(self, peer, header, payload):
        if peer[1] == self.breaks and header[0] == BREAKS_AT:  # the actions of step BREAKS_AT
            raise WorkerError(f"rollout[0]: channel to env[{peer[1]}] broke; did env[{peer[1]}] die?")
        self.sent.append((peer[1], header[0], header[2], payload))
        return 1


def merging_program() -> LoopProgram:
    """Three droppable simulator replicas, two slices, the policy's act (port 1) merging them."""
    return program(frozenset({("env", 0), ("env", 1), ("env", 2)}), simulators=3, stages=2, merge=frozenset({1}))


def test_a_merging_port_takes_in_a_slice_only_once_every_simulator_s_part_of_it_has_arrived():
    mailbox, acted = SlicesMailbox(late=frozenset({(2, 3, 1)})), []  # env[2]'s slice 1 of step 3 is late
    (stats,) = run_loop(merging_program(), [rollout(mailbox, acted)])

    assert [len(obs) for obs in acted] == [6] * 3 + [3, 3] + [6] * (HORIZON - 4)  # slices 0+1 merged but at step 3
    assert stats.calls["act"] == HORIZON + 1 and stats.items["act"] == HORIZON * 6
    for peer, _, s, payload in mailbox.sent:  # each slice's actions go to each env as a message of its own
        assert list(payload) == [peer] and payload[peer].tolist() == [[float(peer)] * 3], (peer, s)
    assert sorted((peer, step, s) for peer, step, s, _ in mailbox.sent) == [
        (peer, step, s) for peer in range(3) for step in range(HORIZON) for s in range(2)
    ]


def test_a_simulator_dropped_while_a_merged_call_sends_gets_nothing_more_and_the_others_their_own_rows():
    mailbox, acted = SlicesMailbox(breaks=1), []
    (stats,) = run_loop(merging_program(), [rollout(mailbox, acted)])

    assert list(stats.lost) == [1] and "channel to env[1] broke" in stats.lost[1].why
    assert [len(obs) for obs in acted] == [6] * (BREAKS_AT + 1) + [4] * (HORIZON - BREAKS_AT - 1)
    for peer, _, _, payload in mailbox.sent:
        assert list(payload) == [peer] and payload[peer].tolist() == [[float(peer)] * 3]
    assert {(step, s) for peer, step, s, _ in mailbox.sent if peer == 1} == {
        (step, s) for step in range(BREAKS_AT) for s in range(2)
    }
    assert {(step, s) for peer, step, s, _ in mailbox.sent if peer == 2} == {
        (step, s) for step in range(HORIZON) for s in range(2)
    }


@pytest.mark.parametrize(
    ("returned", "said"),
    [
        (
            lambda obs: obs[:-1],
            "worker 'rollout' replica 0: port 'act' (iteration 0) returned for env.step what cannot be handed on: 3"
            " row(s), not the 4 of its input (2 + 2 by shard): one row per row given",
        ),
        (
            lambda obs: {"action": obs, "noise": obs[:1]},
            "returned for env.step what cannot be handed on: ['noise']: 1 row(s), not the 4 of its input",
        ),
        (
            lambda obs: None,
            "worker 'rollout' replica 0: port 'act' (iteration 0) returned for env.step None; return its output",
        ),
    ],
    ids=["a row short", "a key a row short", "None"],
)
def test_a_policy_output_that_does_not_match_its_envs_is_refused_naming_the_port_not_handed_on_cut_wrong(
    returned, said
):
    mailbox = Mailbox()

    def act(port, stage, obs):
        return returned(obs)

    with pytest.raises(WorkerError) as caught:
        run_loop(program(frozenset()), [Member("rollout", 0, act, mailbox)])
    assert said in str(caught.value)
    assert mailbox.sent == []  # no simulator was sent a part


def test_simulator_outputs_that_cannot_be_batched_are_named_with_the_port_that_made_them():
    class ListsMailbox(Mailbox):
        def recv(self, peer, header, patience, waiting_for):
            return {peer[1]: [0.0] * ENVS_PER_SHARD}  # a list, not an array

    with pytest.raises(WorkerError) as caught:
        run_loop(program(frozenset()), [rollout(ListsMailbox(), [])])
    assert str(caught.value).startswith(
        "worker 'rollout' replica 0: the outputs of env.obs for its envs cannot be batched into one call of port 'act'"
        " (iteration 0): cannot batch list values from several shards"
    )
