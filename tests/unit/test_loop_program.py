"""The loop program's tolerance of a failed simulator replica, without Ray: an inference replica whose
channel from a droppable simulator replica breaks goes on with the other shards and reports it; one
that is not droppable fails the loop as before."""

from __future__ import annotations

import numpy as np
import pytest

from m2flow.errors import WorkerError
from m2flow.runtime.loop import LoopProgram, Member, run_loop

ENVS_PER_SHARD, HORIZON, BREAKS_AT = 2, 6, 3


class Mailbox:
    """Channels to two simulator replicas; the one to env[1] breaks at step BREAKS_AT."""

    sent_bytes = 0

    def __init__(self):
        self.sent: list[tuple] = []

    def recv(self, peer, header, timeout_s, waiting_for):
        step = header[0]
        if peer == ("env", 1) and step >= BREAKS_AT:
            raise WorkerError("rollout[0]: env[1] closed its channel (it crashed or was killed)")
        return {peer[1]: np.full((ENVS_PER_SHARD, 3), float(peer[1]), np.float32)}

    def send(self, peer, header, payload):
        self.sent.append((peer, header[0], sorted(payload)))
        return 1


def program(droppable: frozenset[int]) -> LoopProgram:
    return LoopProgram(
        ports=(("env", "obs"), ("rollout", "act"), ("env", "step")),
        horizon=HORIZON,
        stages=1,
        shards=2,
        replicas={"env": 2, "rollout": 1},
        iteration=0,
        channel_timeout_s=1.0,
        trace_steps=False,
        droppable=droppable,
    )


def rollout(mailbox: Mailbox, acted: list[np.ndarray]) -> Member:
    def act(port, stage, obs):
        acted.append(obs)
        return obs

    return Member("rollout", 0, act, mailbox)


def test_a_droppable_simulator_whose_channel_breaks_is_dropped_and_the_others_go_on():
    mailbox, acted = Mailbox(), []
    (stats,) = run_loop(program(frozenset({1})), [rollout(mailbox, acted)])

    assert list(stats.lost) == [1] and "closed its channel" in stats.lost[1].why
    assert len(acted) == HORIZON  # every step acted, on both shards until the break, then on env[0]'s
    assert [len(obs) for obs in acted] == [2 * ENVS_PER_SHARD] * BREAKS_AT + [ENVS_PER_SHARD] * (HORIZON - BREAKS_AT)
    assert stats.items["act"] == ENVS_PER_SHARD * (BREAKS_AT * 2 + HORIZON - BREAKS_AT)
    assert {step for peer, step, _ in mailbox.sent if peer == ("env", 1)} == set(range(BREAKS_AT))
    assert {step for peer, step, _ in mailbox.sent if peer == ("env", 0)} == set(range(HORIZON))


def test_a_simulator_that_may_not_be_dropped_fails_the_loop():
    with pytest.raises(WorkerError, match="env\\[1\\] closed its channel"):
        run_loop(program(frozenset()), [rollout(Mailbox(), [])])
