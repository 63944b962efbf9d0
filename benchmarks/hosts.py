"""Two hosts for real, on one machine: the job of tests/integration/test_hosts.py across two network
namespaces (tests/netns.py: each its own address on a veth link to a bridge, a Ray node in each, the
driver in host 0), run three times, each in a fresh two-host cluster: without a fault, with host 1 cut
off (its link taken down) once `--fault-at` iterations are done, and with every process of host 1 killed
then. Needs root and iproute2; without them it says why and writes nothing.

    python benchmarks/hosts.py [--iterations 30] [--fault-at 10]

Reports per run: wall time and env steps/s, the bytes host 1's link carried per iteration (before the
fault), the time from the fault to the failure the run recorded (detection) and from then to the next
iteration it finished (back), iterations done twice, env steps unaccounted (a batch training did not see
whole, or a step count that does not add up), checkpoints lost, and any way out of the namespaces (none:
the traffic stays between them). Last line:

    hosts: partition detected in X s, back in Y s; host killed detected in X s, back in Y s;
    C checkpoints lost, U env steps unaccounted  (one line)
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml
from faults import checkpoints_lost
from results_io import RESULTS, save_result

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the harness and the job are the tests'
from tests.netns import Hosts, available  # noqa: E402
from tests.workflows import two_host_ppo  # noqa: E402

FAULTS = {"none": None, "partition": Hosts.partition, "host killed": Hosts.kill_host}
CHECKPOINT_EVERY, FLOOR_S = 2, 10.0
STEPS_PER_ITERATION = 2 * 2 * 16  # simulator replicas x envs x horizon, as two_host_ppo has them
RUN_TIMEOUT_S = 900.0
M2FLOW = str(Path(sys.executable).with_name("m2flow"))


@dataclass(frozen=True)
class Outcome:
    fault: str
    completed: bool  # the driver exited 0
    wall_s: float
    steps_per_s: float
    link_bytes_per_iteration: float  # host 1's link, both ways, until the fault
    detected_s: float | None  # from the fault to the failure the run recorded
    back_s: float | None  # from that failure to the next iteration finished
    failure: str | None  # what the run said
    iterations_redone: int
    env_steps_unaccounted: int
    checkpoints_lost: int
    ways_out: list[str]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def one_run(out: Path, fault: str, iterations: int, fault_at: int) -> Outcome:
    """The job across two fresh hosts, `fault` struck at host 1 once `fault_at` iterations are logged."""
    folder = out / fault.replace(" ", "-")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    run_dir = folder / "hosts"
    with Hosts(2, cpus=2) as hosts:
        address = hosts.ray_address
        raw = two_host_ppo(folder, address, iterations=iterations, checkpoint_every=CHECKPOINT_EVERY, floor_s=FLOOR_S)
        path = folder / "hosts.yaml"
        path.write_text(yaml.safe_dump(raw))
        ways_out, carried = hosts.ways_out(), hosts.link_bytes(1)
        with (folder / "driver.log").open("w") as log:
            began = time.time()
            driver = hosts.start_in(0, [M2FLOW, "run", str(path)], stdout=log, stderr=log)
            seen: list[float] = []  # when each metrics line (an iteration finished) was seen
            struck_at, link = None, None
            try:
                while driver.poll() is None and time.time() - began < RUN_TIMEOUT_S:
                    lines = len(read_jsonl(run_dir / "metrics.jsonl"))
                    seen += [time.time()] * (lines - len(seen))
                    if FAULTS[fault] is not None and struck_at is None and lines >= fault_at:
                        link = (hosts.link_bytes(1) - carried) / lines
                        struck_at = time.time()
                        FAULTS[fault](hosts, 1)
                    time.sleep(0.05)
                wall_s = time.time() - began
            finally:
                driver.kill()
                driver.wait()
            if link is None:
                link = (hosts.link_bytes(1) - carried) / max(1, len(seen))
    metrics, failures = read_jsonl(run_dir / "metrics.jsonl"), read_jsonl(run_dir / "failures.jsonl")
    first = failures[0] if failures else None
    detected_s = first["detected_at"] - struck_at if first and struck_at else None
    back = [t for t in seen if first and t > first["detected_at"]]
    last = {m["iteration"]: m for m in metrics}  # an iteration done again: its last record stands
    unaccounted = sum(abs(STEPS_PER_ITERATION - last[i]["actor/steps_consumed"]) for i in last)
    unaccounted += abs(iterations * STEPS_PER_ITERATION - max((m["env_steps"] for m in metrics), default=0))
    return Outcome(
        fault=fault,
        completed=driver.returncode == 0 and sorted(last) == list(range(iterations)),
        wall_s=wall_s,
        steps_per_s=len(last) * STEPS_PER_ITERATION / wall_s,
        link_bytes_per_iteration=link,
        detected_s=detected_s,
        back_s=back[0] - first["detected_at"] if back else None,
        failure=first["error"] if first else None,
        iterations_redone=len(metrics) - len(last),
        env_steps_unaccounted=int(unaccounted),
        checkpoints_lost=checkpoints_lost(run_dir, due_checkpoints(iterations)),
        ways_out=ways_out,
    )


def due_checkpoints(iterations: int) -> list[int]:
    """The iterations the run writes a checkpoint after: every CHECKPOINT_EVERY, and the last."""
    return sorted({*range(CHECKPOINT_EVERY - 1, iterations, CHECKPOINT_EVERY), iterations - 1})


def seconds(value: float | None) -> str:
    return "not seen" if value is None else f"{value:.1f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--fault-at", type=int, default=10, help="iterations logged before the fault")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    why_not = available()
    if why_not is not None:
        sys.exit(f"hosts: not run: {why_not}")

    scratch = Path(args.out) / "tmp" / "hosts"
    outcomes = []
    for fault in FAULTS:
        outcome = one_run(scratch, fault, args.iterations, args.fault_at)
        outcomes.append(outcome)
        print(json.dumps(asdict(outcome)), flush=True)
    save_result("hosts", {"args": vars(args), "runs": [asdict(o) for o in outcomes]}, args.out)
    struck = [o for o in outcomes if o.fault != "none"]
    print(
        "hosts: "
        + "; ".join(f"{o.fault} detected in {seconds(o.detected_s)}, back in {seconds(o.back_s)}" for o in struck)
        + f"; {sum(o.checkpoints_lost for o in outcomes)} checkpoints lost,"
        f" {sum(o.env_steps_unaccounted for o in outcomes)} env steps unaccounted"
    )
    sound = all(o.completed and not o.ways_out for o in outcomes) and all(o.detected_s is not None for o in struck)
    sys.exit(0 if sound else 1)


if __name__ == "__main__":
    main()
