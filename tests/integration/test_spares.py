"""Spare processes (`run.spares`): a replaced simulator runs on in the spare process started for it ahead,
its imports done, and a new spare stands by for the next failure; with spares off a fresh process starts."""

from __future__ import annotations

import threading
import time

import pytest

import m2flow as mf
from m2flow.config import spec_from_dict
from tests.workflows import recovery_ppo

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_cluster")]

HORIZON, ITERATIONS = 16, 3


def killed_simulator(tmp_path, spares: bool) -> mf.WorkflowSpec:
    """Replica 1 of the simulator killed in step 6 of iteration 1, once the file `armed` appears (its loop
    waits for it)."""
    name = f"spares-{spares}"
    raw = recovery_ppo(
        tmp_path, name, horizon=HORIZON, iterations=ITERATIONS, seed=3, on_failure="replace", spares=spares
    )
    env = raw["workers"]["env"]
    env["class"] = "tests.workers_for_tests.FaultyGymEnv"
    env["args"].update(fault="kill", fault_replica=1, fault_at_step=HORIZON + 6, marker=str(tmp_path / "fault"))
    env["args"]["armed_by"] = str(tmp_path / "armed")
    return spec_from_dict(raw)


def spares_of(workflow: str) -> dict[str, int]:
    """The spare processes standing by for a running workflow: name -> pid."""
    import ray

    prefix = f"m2flow:{workflow}:spare:"
    actors = {name: ray.get_actor(name) for name in ray.util.list_named_actors() if name.startswith(prefix)}
    return {name: ray.get(actor.info.remote(), timeout=60)["pid"] for name, actor in actors.items()}


def arm_once_spares_are_ready(workflow: str, armed, seen: dict) -> threading.Thread:
    """A thread that waits for the workflow's spares to have done their imports, notes them, and arms the
    fault."""
    import ray

    def arm() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (names := [n for n in spares_of(workflow) if ":env:" in n]):
            time.sleep(0.2)
        ray.get([ray.get_actor(n).ready.remote() for n in names], timeout=120)
        seen.update(spares_of(workflow))
        armed.write_text("armed\n")

    thread = threading.Thread(target=arm, daemon=True)
    thread.start()
    return thread


def test_a_killed_simulator_runs_on_in_its_spare_process_and_a_new_spare_stands_by(tmp_path):
    spec = killed_simulator(tmp_path, spares=True)
    seen: dict[str, int] = {}
    arming = arm_once_spares_are_ready(spec.name, tmp_path / "armed", seen)
    result = mf.run(spec)
    arming.join(timeout=5)

    (failure,) = result.failures
    assert failure["replaced"] == "env[1]" and failure["spare"] is True
    env_spares = {name: pid for name, pid in seen.items() if ":env:" in name}
    assert len(env_spares) == 2  # one per core the simulator's replicas run on
    assert result.pids["env[1]"] in env_spares.values()  # the replacement runs in a spare that stood by
    per_iteration = 2 * 2 * HORIZON
    assert [h["env_steps"] for h in result.history] == [per_iteration * (i + 1) for i in range(ITERATIONS)]


def test_with_spares_off_a_killed_simulator_starts_a_fresh_process_and_none_stands_by(tmp_path):
    spec = killed_simulator(tmp_path, spares=False)
    (tmp_path / "armed").write_text("armed\n")
    before: dict[str, int] = {}

    def note_spares() -> None:
        time.sleep(3)
        before.update(spares_of(spec.name))

    watcher = threading.Thread(target=note_spares, daemon=True)
    watcher.start()
    result = mf.run(spec)
    watcher.join(timeout=5)

    (failure,) = result.failures
    assert failure["replaced"] == "env[1]" and failure["spare"] is False
    assert before == {}
