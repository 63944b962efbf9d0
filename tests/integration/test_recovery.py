"""Fault injection: real kills of workers and of a checkpoint writer. The run finishes, loses nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

import m2flow as mf
from m2flow.config import spec_from_dict
from m2flow.errors import WorkerError
from m2flow.runtime.checkpoint import latest_checkpoint, load_checkpoint
from m2flow.runtime.launch import replica_process
from tests.conftest import ROOT
from tests.workflows import pendulum_ppo

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_cluster")]
FLOOR_S = 15.0


def ppo_spec(tmp_path, name: str, actor_replicas: int = 1, iterations: int = 6, **run) -> mf.WorkflowSpec:
    return spec_from_dict(ppo_raw(tmp_path, name, actor_replicas, iterations, **run))


def ppo_raw(tmp_path, name: str, actor_replicas: int = 1, iterations: int = 6, **run) -> dict:
    raw = pendulum_ppo(
        tmp_path,
        name,
        hidden=[16, 16],
        actor={"num_minibatches": 4, "update_epochs": 2},
        run={
            "iterations": iterations,
            "seed": 2,
            "checkpoint_every": 1,
            "on_failure": "restart",
            "timeouts": {"floor_s": FLOOR_S},
            **run,
        },
    )
    raw["workers"]["actor"]["replicas"] = actor_replicas
    raw["workers"]["env"]["replicas"] = actor_replicas  # a data-parallel rank takes whole simulator shards
    return raw


def kill_later(workflow: str, replica: str, metrics, after_iteration: int, delay_s: float) -> dict:
    """Kill the process hosting a worker replica (a real process kill) once `after_iteration` has been logged."""
    import ray

    record: dict = {}

    def run():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            lines = metrics.read_text().splitlines() if metrics.exists() else []
            if any(json.loads(line)["iteration"] >= after_iteration for line in lines):
                break
            time.sleep(0.05)
        time.sleep(delay_s)
        actor = replica_process(workflow, replica)  # env:0 may share its process with rollout:0 (colocate)
        record["killed_at"] = time.time()  # before the kill: the run may notice it before ray.kill returns
        ray.kill(actor, no_restart=True)

    threading.Thread(target=run, daemon=True).start()
    return record


def assert_complete(result, iterations: int) -> None:
    assert [h["iteration"] for h in result.history] == list(range(iterations))
    for it in range(iterations):
        state, meta = load_checkpoint(result.run_dir / "checkpoints" / f"iter_{it:08d}")
        assert meta["iteration"] == it and (result.run_dir / "checkpoints" / f"iter_{it:08d}" / "actor").is_dir()
    # the training state continued from the checkpoint: one PPO update per iteration, none lost or repeated
    assert result.last["actor/weights_version"] == iterations


@pytest.mark.parametrize(("victim", "ranks"), [("env:0", 1), ("actor:1", 2)])
def test_a_killed_worker_is_detected_and_the_run_recovers(tmp_path, victim, ranks):
    name = f"kill-{victim.replace(':', '')}"
    spec = ppo_spec(tmp_path, name, actor_replicas=ranks)
    record = kill_later(name, victim, tmp_path / name / "metrics.jsonl", after_iteration=1, delay_s=0.1)
    result = mf.run(spec)
    assert "killed_at" in record, "the test did not get to kill the worker"
    assert len(result.failures) == 1
    detection = result.failures[0]["detected_at"] - record["killed_at"]
    assert 0 <= detection < FLOOR_S, f"detected after {detection:.1f}s"
    assert_complete(result, 6)


def test_a_worker_that_keeps_failing_stops_the_run_with_its_history(tmp_path):
    spec = spec_from_dict(
        {
            "name": "always-crashes",
            "workers": {
                "env": {"kind": "simulator", "class": "tests.workers_for_tests.Counter", "args": {"num_envs": 2}},
                "policy": {"kind": "inference", "class": "tests.workers_for_tests.Crashing"},
            },
            "flow": {"loop": {"horizon": 3, "edges": ["env.obs -> policy.act", "policy.act -> env.step"]}},
            "run": {
                "iterations": 3,
                "output_dir": str(tmp_path),
                "progress": False,
                "on_failure": "restart",
                "max_restarts": 2,
            },
        }
    )
    with pytest.raises(WorkerError) as info:
        mf.run(spec)
    message = str(info.value)
    assert "stopping after 2 restart(s) (run.max_restarts=2)" in message
    assert message.count("iteration 0: worker 'policy' replica 0 failed in port 'act'") == 3


WRITER = """
import sys, torch
from m2flow.runtime.checkpoint import save_checkpoint
root = sys.argv[1]
save_checkpoint(root, 1, {"w": torch.ones(4)}, {"env_steps": 10})
print("saved", flush=True)
save_checkpoint(root, 2, {"w": torch.ones(150_000_000)}, {"env_steps": 20})
"""


def test_a_simulator_hung_as_a_checkpoint_is_gathered_is_caught_at_a_deadline_from_the_last_one_and_restarts(tmp_path):
    floor_s = 8.0  # silence_s far above it: the deadline is what catches the stopped process here
    timeouts = {"floor_s": floor_s, "start_s": 300, "silence_s": 300}
    raw = ppo_raw(tmp_path, "hung-checkpoint", iterations=4, timeouts=timeouts)
    env = raw["workers"]["env"]
    env["replicas"] = 2
    env["class"] = "tests.workers_for_tests.FaultyGymEnv"
    first_loop = raw["flow"]["loop"]["horizon"]  # step calls: one a loop step (one pipeline stage)
    env["args"].update(fault="stop", fault_replica=1, fault_in="checkpoint", fault_at_step=first_loop + 1)
    env["args"]["marker"] = str(tmp_path / "fault")
    result = mf.run(spec_from_dict(raw))
    struck_at = float((tmp_path / "fault").read_text())

    (failure,) = result.failures
    assert failure["replaced"] is None  # a restart from the checkpoint before
    assert "state_dict() hooks" in failure["error"] and "env[1]" in failure["error"], failure["error"]
    # x20 the first checkpoint's time, at least the floor, and at most 5 s of grace for a peer's own error:
    # far from the 300 s the workers may take to start, which the first checkpoint was given
    assert floor_s - 1 <= failure["detected_at"] - struck_at < 4 * floor_s, failure
    assert_complete(result, 4)


def test_a_kill_while_saving_leaves_the_previous_checkpoint_loadable(tmp_path):
    root = tmp_path / "checkpoints"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(root)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert writer.stdout.readline().strip() == "saved"
    deadline = time.monotonic() + 60
    while not (root / ".iter_00000002.tmp" / "state.pt").exists():
        assert time.monotonic() < deadline and writer.poll() is None, "the writer never started the second save"
        time.sleep(0.005)
    writer.kill()
    writer.wait(timeout=30)
    assert not (root / "iter_00000002").exists()
    latest = latest_checkpoint(root)
    assert latest is not None and latest.name == "iter_00000001"
    state, meta = load_checkpoint(latest)
    assert meta["iteration"] == 1 and state["w"].sum() == 4
