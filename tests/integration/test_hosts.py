"""Two hosts for real (`tests/netns.py`: network namespaces on veth links, a Ray node in each): the job
runs across them — loop channels over TCP between hosts, a training group with a rank on each — through
the CLI from host 0. A partition of host 1 and a host whose processes are all killed are detected within
the run's deadlines, named, and the run goes on on the host that is left, from its last checkpoint, with
nothing lost; no route leads out of the hosts' namespaces, and every process of the run is in one. A rank
that hangs mid-update is named with the other rank, each asked where it is on its own host."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from m2flow.runtime.checkpoint import load_checkpoint
from tests.netns import Hosts, available
from tests.workflows import simulator_across_hosts, two_host_ppo

UNAVAILABLE = available()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(UNAVAILABLE is not None, reason=f"needs network namespaces: {UNAVAILABLE}"),
]

# a checkpoint every second iteration, none after the third: the fault lands in the fourth's loop or update
ITERATIONS, FLOOR_S, CHECKPOINT_EVERY = 12, 10.0, 2
M2FLOW = str(Path(sys.executable).with_name("m2flow"))


def job(out: Path, address: str, actor: dict | None = None) -> Path:
    raw = two_host_ppo(out, address, iterations=ITERATIONS, checkpoint_every=CHECKPOINT_EVERY, floor_s=FLOOR_S)
    raw["workers"]["actor"].update(actor or {})
    path = out / "hosts.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for(condition, timeout_s: float, what: str, driver: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert driver.poll() is None, f"the run ended before {what}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"waited {timeout_s:g}s for {what}:\n{log.read_text()[-3000:]}"
        time.sleep(0.1)


def strike_mid_run(hosts: Hosts, path: Path, fault: str, before: Callable[[dict, int], None]) -> tuple[float, str]:
    """Run `path` from host 0 through the CLI; once the checkpoint after the fourth iteration is written,
    `before` checks where the replicas run (processes.json, the driver's pid), then host 1 is partitioned or
    killed (`fault`): in the fifth iteration, whose loop waits on host 1, not while a checkpoint gathers the
    replicas' state (a replica lost then restarts the run: not what these tests are about). When the fault
    struck, and the driver's output once the run ended well."""
    run_dir, log_path = path.parent / "hosts", path.parent / "driver.log"
    log = log_path.open("w")
    driver = hosts.start_in(0, [M2FLOW, "run", str(path)], stdout=log, stderr=log)
    try:
        checkpointed = (run_dir / "checkpoints" / f"iter_{2 * CHECKPOINT_EVERY - 1:08d}").exists
        wait_for(checkpointed, 180, "the second checkpoint", driver, log_path)
        before(json.loads((run_dir / "processes.json").read_text()), driver.pid)
        struck_at = time.time()
        if fault == "partition":
            hosts.partition(1)
        else:
            hosts.kill_host(1)
        driver.wait(timeout=300)
    finally:
        driver.kill()
        log.close()
    output = log_path.read_text()
    assert driver.returncode == 0, output[-3000:]
    return struck_at, output


@pytest.mark.parametrize("fault", ["partition", "host killed"])
def test_a_job_across_two_hosts_loses_one_and_goes_on_on_the_other(tmp_path, fault):
    on_host_1 = []

    def spread_over_both_hosts(where: dict, driver_pid: int) -> None:
        across = {name: entry["address"] for name, entry in where.items()}
        on_host_1.extend(name for name, address in across.items() if address == hosts.address(1))
        assert {across["actor[0]"], across["actor[1]"]} == {hosts.address(0), hosts.address(1)}
        assert across["env[0]"] != across["rollout[0]"]  # the loop's channels cross hosts
        inside = {host: set(hosts.pids(host)) for host in (0, 1)}
        assert driver_pid in inside[0]  # the driver and every worker run in the hosts' namespaces
        for name, entry in where.items():
            assert entry["pid"] in inside[[hosts.address(0), hosts.address(1)].index(entry["address"])], name

    run_dir = tmp_path / "hosts"
    with Hosts(2, cpus=2) as hosts:
        assert hosts.ways_out() == []  # traffic can only go between the hosts' namespaces
        struck_at, output = strike_mid_run(hosts, job(tmp_path, hosts.ray_address), fault, spread_over_both_hosts)

    failures = read_jsonl(run_dir / "failures.jsonl")
    assert failures, output[-3000:]
    first = failures[0]
    assert first["detected_at"] - struck_at < 3 * FLOOR_S, output[-3000:]
    worker_words = [f"worker '{n.split('[')[0]}' replica {n.split('[')[1].rstrip(']')}" for n in on_host_1]
    # what was on host 1, or host 1 itself: a rank on host 0 may see its peer's connection reset first
    named = on_host_1 + worker_words + [f"[{hosts.address(1)}]"]
    assert any(name in first["error"] for name in named), first["error"]
    assert f"m2flow: lost node(s) at {hosts.address(1)}" in " ".join(output.split())
    iterations = [m["iteration"] for m in read_jsonl(run_dir / "metrics.jsonl")]
    assert iterations == list(range(ITERATIONS))  # every iteration logged once: those done again after the restart too
    after = json.loads((run_dir / "processes.json").read_text())
    assert {entry["address"] for entry in after.values()} == {hosts.address(0)}
    assert_nothing_lost(run_dir)


def assert_nothing_lost(run_dir: Path, iterations: int = ITERATIONS) -> None:
    """Every iteration trained on a whole batch (an iteration done again: its record is the last run's), the env
    steps add up, and every checkpoint the run wrote loads."""
    last = {m["iteration"]: m for m in read_jsonl(run_dir / "metrics.jsonl")}
    per_iteration = 2 * 2 * 16  # simulator replicas x envs x horizon, as `job` has them
    assert [last[i]["actor/steps_consumed"] for i in range(iterations)] == [per_iteration] * iterations
    assert [last[i]["env_steps"] for i in range(iterations)] == [per_iteration * (i + 1) for i in range(iterations)]
    for i in range(CHECKPOINT_EVERY - 1, iterations, CHECKPOINT_EVERY):
        load_checkpoint(run_dir / "checkpoints" / f"iter_{i:08d}")


@pytest.mark.parametrize("fault", ["partition", "host killed"])
def test_a_simulator_on_a_lost_host_is_replaced_in_place_on_a_core_of_the_host_left(tmp_path, fault):
    iterations = 30
    run_dir, path = tmp_path / "hosts", tmp_path / "moved.yaml"

    def only_a_simulator_on_host_1(where: dict, driver_pid: int) -> None:
        assert [name for name, entry in where.items() if entry["address"] == hosts.address(1)] == ["env[1]"]

    with Hosts(2, cpus=2) as hosts:
        raw = simulator_across_hosts(tmp_path, hosts.ray_address, iterations=iterations, floor_s=FLOOR_S)
        path.write_text(yaml.safe_dump(raw))
        struck_at, output = strike_mid_run(hosts, path, fault, only_a_simulator_on_host_1)
    output = " ".join(output.split())

    (failure,) = read_jsonl(run_dir / "failures.jsonl")  # one failure, replaced in place: no restart
    assert failure["replaced"] == "env[1]", failure
    assert failure["detected_at"] - struck_at < 3 * FLOOR_S, output[-3000:]
    assert failure["borrowed"] in {"n0/cpu0", "n0/cpu1"}, failure  # a core of host 0, the driver's node
    assert failure["lost_node"] == hosts.address(1), failure
    assert f"the node at {hosts.address(1)} no longer answers" in output, output[-3000:]
    assert "m2flow: restart" not in output, output[-3000:]
    iterations_run = [m["iteration"] for m in read_jsonl(run_dir / "metrics.jsonl")]
    assert iterations_run == list(range(iterations))  # each once: nothing done again
    after = json.loads((run_dir / "processes.json").read_text())
    assert {entry["address"] for entry in after.values()} == {hosts.address(0)}
    assert_nothing_lost(run_dir, iterations)


def test_a_training_rank_hung_across_hosts_is_named_with_both_ranks_asked_on_their_hosts(tmp_path):
    hang = {"class": "tests.workers_for_tests.FaultyPPO"}
    args = {"fault": "stop", "fault_replica": 1, "fault_at_step": 3, "marker": str(tmp_path / "hang")}
    with Hosts(2, cpus=2) as hosts:
        path = job(tmp_path, hosts.ray_address, hang)
        raw = yaml.safe_load(path.read_text())
        raw["workers"]["actor"]["args"].update(args)
        path.write_text(yaml.safe_dump(raw))
        log = (tmp_path / "driver.log").open("w")
        tests_importable = {"PYTHONPATH": str(Path(__file__).parents[2])}  # the faulty worker is the tests'
        driver = hosts.start_in(0, [M2FLOW, "run", str(path)], tests_importable, stdout=log, stderr=log)
        try:
            driver.wait(timeout=400)
        finally:
            driver.kill()
            log.close()
        output = (tmp_path / "driver.log").read_text()
        assert driver.returncode == 0, output[-3000:]

    (failure,) = read_jsonl(tmp_path / "hosts" / "failures.jsonl")
    error = failure["error"]
    assert "process group of 'actor': 1 of 2 ranks in a collective" in error, error
    assert "not arrived: actor[1] no answer within 2s: stopped, or hung outside Python" in error, error
    assert "not asked" not in error, error  # the rank on host 1 was asked there too
