"""Quarantine's parts: an env's failure named through the worker's port and across processes, the count
that quarantines it, and the seed a quarantined env starts from."""

from __future__ import annotations

import pickle

import gymnasium as gym
import pytest

import m2flow
from m2flow.context import RESEED_STRIDE, WorkerContext
from m2flow.runtime.host import PortFailed, WorkerHost
from m2flow.runtime.quarantine import Quarantine
from m2flow.workers.env.env_ids import registered
from m2flow.workers.env.evaluation import EvaluationConfig
from m2flow.workers.env.failures import NamedFailures

BAD_STARTS = "tests.workers_for_tests:InvertedPendulumBadStarts-v0"


def test_an_env_is_quarantined_at_every_nth_failure_of_its_own_and_unnamed_failures_count_for_none():
    quarantine = Quarantine(after=2)

    assert [quarantine.record(3), quarantine.record(5), quarantine.record(None)] == [False, False, False]
    assert quarantine.record(3) is True and quarantine.times == {3: 1}
    assert quarantine.record(3) is False and quarantine.record(3) is True  # counted afresh after a quarantine
    assert quarantine.times == {3: 2} and quarantine.failures == {5: 1}


def test_a_quarantined_env_seed_moves_by_the_stride_once_per_quarantine_and_a_group_moves_together():
    ctx = WorkerContext(seed=7, quarantined={2: 1})

    assert [ctx.env_seed(i) for i in range(4)] == [7, 8, 7 + 2 + RESEED_STRIDE, 10]
    assert ctx.with_(quarantined={2: 2}).env_seed(2) == 7 + 2 + 2 * RESEED_STRIDE
    group = range(0, 4)  # four envs starting from one seed, as a GRPO group does
    assert {ctx.env_seed(i, offset=0, shared_by=group) for i in group} == {7 + RESEED_STRIDE}
    assert ctx.env_seed(5, offset=1, shared_by=range(4, 8)) == 8  # another group keeps its seed
    assert EvaluationConfig.model_fields["seed"].default + 10_000 < RESEED_STRIDE  # past evaluation seeds too
    assert pickle.loads(pickle.dumps(ctx)) == ctx


def test_a_failing_env_names_its_index_and_keeps_the_original_error():
    env = NamedFailures(gym.make(BAD_STARTS, bad_seeds=[11]), index=6)

    env.reset(seed=10)
    with pytest.raises(m2flow.EnvFailed, match=r"env 6 failed: reset raised RuntimeError: infeasible") as caught:
        env.reset(seed=11)
    assert caught.value.env == 6 and isinstance(caught.value.__cause__, RuntimeError)
    restored = pickle.loads(pickle.dumps(caught.value))
    assert (restored.env, restored.why) == (6, caught.value.why)


def test_a_port_failure_carries_the_env_across_processes_and_says_it_on_one_line():
    failed = PortFailed("env", 1, "obs", "iteration 0", "Traceback ...\nm2flow.errors.EnvFailed: env 3 failed: x\n", 3)

    restored = pickle.loads(pickle.dumps(failed))
    assert (restored.worker, restored.replica, restored.port, restored.env) == ("env", 1, "obs", 3)
    assert restored.headline() == (
        "worker 'env' replica 1 failed in port 'obs' (iteration 0): m2flow.errors.EnvFailed: env 3 failed: x"
    )


class FailsOutsideTheLoop:
    def metrics(self):
        raise m2flow.EnvFailed(4, "its renderer crashed")


def test_an_env_named_by_a_hook_outside_the_loop_is_carried_like_one_named_by_a_port(tmp_path):
    ctx = WorkerContext(worker="env", replica=1, output_dir=str(tmp_path))
    host = WorkerHost(FailsOutsideTheLoop, {}, ctx, instances=1, dist=None)

    with pytest.raises(PortFailed, match=r"failed in port 'metrics' \(hook metrics\)") as caught:
        host.hook("metrics")
    assert caught.value.env == 4 and "env 4 failed: its renderer crashed" in caught.value.headline()


def test_an_env_id_of_a_module_that_registers_it_is_accepted_and_a_module_that_does_not_import_is_named():
    assert registered(BAD_STARTS) == BAD_STARTS
    with pytest.raises(ValueError, match=r"its module 'no_such_module' does not import"):
        registered("no_such_module:Env-v0")
