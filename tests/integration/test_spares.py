"""Spare processes (`run.spares`): a replaced simulator runs on in the spare process started for it ahead,
its imports done, and a new spare stands by for the next failure; with spares off a fresh process starts."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

import m2flow as mf
from m2flow.config import spec_from_dict
from tests.workflows import recovery_ppo

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_cluster")]

HORIZON, ITERATIONS = 16, 5  # the iterations after the fault leave the watcher time to see the new spare


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
    raw["placement"]["replan"] = False  # the same processes throughout (a re-plan that switches restarts them)
    return spec_from_dict(raw)


def spares_of(workflow: str) -> dict[str, int]:
    """The spare processes standing by for a running workflow: name -> pid."""
    import ray

    prefix = f"m2flow:{workflow}:spare:"
    found = {}
    for name in ray.util.list_named_actors():
        if name.startswith(prefix):
            with contextlib.suppress(ray.exceptions.RayError, ValueError):  # gone since it was listed
                found[name] = ray.get(ray.get_actor(name).info.remote(), timeout=60)["pid"]
    return found


def env_spare_names(workflow: str) -> set[str]:
    """The names of the simulator's spares (a name is taken as its process is asked for, before it starts)."""
    import ray

    return {name for name in ray.util.list_named_actors() if name.startswith(f"m2flow:{workflow}:spare:env:")}


def wait_for(condition, timeout_s: float = 120.0, every_s: float = 0.2):
    """`condition()`'s first truthy value, polled every `every_s` until `timeout_s` (None if it never was)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(every_s)
    return None


class Watcher:
    """Beside a run: waits for its simulator's spares to have done their imports, notes them, `before_fault`s
    them (kill one, say), arms the fault, then notes the spares standing by after the replacement."""

    def __init__(self, workflow: str, tmp_path, before_fault=lambda spares: None):
        self.workflow, self.tmp_path, self.before_fault = workflow, tmp_path, before_fault
        self.before: dict[str, int] = {}
        self.after: set[str] = set()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def env_spares(self) -> dict[str, int]:
        return {name: pid for name, pid in spares_of(self.workflow).items() if ":spare:env:" in name}

    def _watch(self) -> None:
        import ray

        if (spares := wait_for(self.env_spares)) is not None:
            ray.get([ray.get_actor(name).ready.remote() for name in spares], timeout=120)
            self.before = spares
            self.before_fault(spares)
        (self.tmp_path / "armed").write_text("armed\n")
        wait_for(lambda: (self.tmp_path / "fault").exists())
        # the new spare stands by from the replacement's iteration to the run's end: look often
        self.after = wait_for(lambda: env_spare_names(self.workflow) - set(self.before), 60, every_s=0.05) or set()


def test_a_killed_simulator_runs_on_in_its_spare_process_and_a_new_spare_stands_by(tmp_path):
    spec = killed_simulator(tmp_path, spares=True)
    watcher = Watcher(spec.name, tmp_path)
    result = mf.run(spec)
    watcher.thread.join(timeout=5)

    (failure,) = result.failures
    assert failure["replaced"] == "env[1]" and failure["spare"] is True
    assert len(watcher.before) == 1  # one for the simulator's replicas on this node (each pinned to its core)
    assert result.pids["env[1]"] in watcher.before.values()  # the replacement runs in the spare that stood by
    assert len(watcher.after) == 1, "a new spare stands by once the iteration's replacement is done"
    per_iteration = 2 * 2 * HORIZON
    assert [h["env_steps"] for h in result.history] == [per_iteration * (i + 1) for i in range(ITERATIONS)]


def test_a_spare_that_died_standing_by_is_passed_over_for_a_fresh_process(tmp_path):
    import ray

    def kill_them(spares: dict[str, int]) -> None:
        for name in spares:
            ray.kill(ray.get_actor(name), no_restart=True)

    spec = killed_simulator(tmp_path, spares=True)
    watcher = Watcher(spec.name, tmp_path, before_fault=kill_them)
    result = mf.run(spec)
    watcher.thread.join(timeout=5)

    assert watcher.before, "no spare stood by to be killed"
    (failure,) = result.failures  # replaced in place all the same, not restarted
    assert failure["replaced"] == "env[1]" and failure["spare"] is False
    assert result.pids["env[1]"] not in watcher.before.values()
    per_iteration = 2 * 2 * HORIZON
    assert [h["env_steps"] for h in result.history] == [per_iteration * (i + 1) for i in range(ITERATIONS)]


def test_with_spares_off_a_killed_simulator_starts_a_fresh_process_and_none_stands_by(tmp_path):
    spec = killed_simulator(tmp_path, spares=False)
    (tmp_path / "armed").write_text("armed\n")
    seen: dict[str, int] = {}

    def note_spares_at_the_fault() -> None:  # the workers have started, the replacer stood spares by, if any
        if wait_for(lambda: (tmp_path / "fault").exists()):
            seen.update(spares_of(spec.name))

    watcher = threading.Thread(target=note_spares_at_the_fault, daemon=True)
    watcher.start()
    result = mf.run(spec)
    watcher.join(timeout=5)

    assert (tmp_path / "fault").exists()
    (failure,) = result.failures
    assert failure["replaced"] == "env[1]" and failure["spare"] is False
    assert seen == {}
