"""Chaos under load: a long PPO run with faults injected at a fixed rate, between two runs of the same job
(same seed) without faults, one before and one after it, each in a fresh local Ray cluster.

    python benchmarks/chaos.py [--iterations 600] [--fault-every 60] [--seed 0]

Every `--fault-every` seconds one fault, drawn at random (seeded): a simulator or the inference process
killed (SIGKILL) or hung (SIGSTOP), a training rank killed or hung, or a slow simulator (stopped for a
second, then continued: slow, not failed). The run uses `run.on_failure: replace`: a simulator or inference
fault should be recovered in place; a training fault is recovered in place when it strikes while training
runs (the checkpoint right before the iteration holds its state), by a restart from the last checkpoint
when it strikes between (say in the weight sync). Reports faults injected,
detected (and how long after), recovered in place and by restart, iterations and env steps redone,
checkpoints lost, env steps unaccounted (a batch training did not see whole), and throughput and final
return against the fault-free runs. The machine's speed drifts by more than the faults cost: the
throughput is taken against the mean of the fault-free runs before and after (a drift steady over the
three runs cancels), also corrected for the drift (each run's speed taken from its iterations no
failure touched), and estimated inside the run with faults (each fault's cost: a touched iteration's
time over its undisturbed neighbours', the least sensitive to the drift). Last line:

    chaos: F faults, D detected, R in place, S by restart, C checkpoints lost, throughput X% of fault-free
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil
from faults import checkpoints_lost, job_dict
from results_io import save_result, share_down

import m2flow as mf
from m2flow.config import spec_from_dict
from m2flow.runtime.deadlines import Deadlines
from m2flow.runtime.run_record import RunResult

HORIZON, ENV_REPLICAS, ENVS_PER_REPLICA = 64, 2, 4  # as faults.py's job has them
STEPS_PER_ITERATION = HORIZON * ENV_REPLICAS * ENVS_PER_REPLICA
WARM_UP_ITERATIONS = 3  # faults start once the run has measured its costs and re-planned
SLOW_FOR_S = 1.0
WINDOW = 25  # undisturbed iterations on either side that say how fast the machine ran a faulted one
FLOOR_S = 10.0  # the run's deadlines: x20 the plan's prediction, at least this


@dataclass(frozen=True)
class FaultKind:
    victims: tuple[str, ...]  # replicas, as the run's processes.json names them
    signal: signal.Signals
    failure: bool  # a fault the run must detect (a slow replica is not one)
    loop: bool  # of a loop replica: always recovered in place, never by a restart


SIMULATORS, POLICY, TRAINING = ("env[0]", "env[1]"), ("rollout[0]",), ("actor[0]", "actor[1]")
FAULT_KINDS = {
    "kill simulator": FaultKind(SIMULATORS, signal.SIGKILL, failure=True, loop=True),
    "hang simulator": FaultKind(SIMULATORS, signal.SIGSTOP, failure=True, loop=True),
    "kill inference": FaultKind(POLICY, signal.SIGKILL, failure=True, loop=True),
    "hang inference": FaultKind(POLICY, signal.SIGSTOP, failure=True, loop=True),
    "kill training": FaultKind(TRAINING, signal.SIGKILL, failure=True, loop=False),
    "hang training": FaultKind(TRAINING, signal.SIGSTOP, failure=True, loop=False),
    "slow simulator": FaultKind(SIMULATORS, signal.SIGSTOP, failure=False, loop=True),
}


@dataclass
class Fault:
    kind: str
    victim: str
    pid: int
    at: float  # time.time() just before the signal
    detected_s: float | None = None  # from `at` to the failure the run recorded
    recovered: str | None = None  # "in place", "by restart", or None (not a failure, or not seen)


def job(out: Path, name: str, iterations: int, seed: int) -> mf.WorkflowSpec:
    """faults.py's job, long, with failures replaced in place where they can be; one plan for both runs
    (no re-plan from the costs the first run cached)."""
    raw = job_dict(out, name, horizon=HORIZON)
    raw["placement"].update(pipeline_stages=1, replan=False)
    raw["run"].update(
        iterations=iterations,
        seed=seed,
        on_failure="replace",
        max_replacements=1000,
        max_restarts=1000,
        timeouts={"floor_s": FLOOR_S},
    )
    return spec_from_dict(raw)


class Injector:
    """Injects one fault every `every` seconds into the run writing `run_dir`, from its third iteration on."""

    def __init__(self, run_dir: Path, every: float, rng: random.Random):
        self.run_dir, self.every, self.rng = run_dir, every, rng
        self.faults: list[Fault] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._inject, daemon=True)

    def __enter__(self) -> Injector:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join(timeout=SLOW_FOR_S + 5)

    def _inject(self) -> None:
        metrics = self.run_dir / "metrics.jsonl"
        while not (metrics.exists() and metrics.read_text().count("\n") >= WARM_UP_ITERATIONS):
            if self.done.wait(0.1):
                return
        while not self.done.wait(self.every):
            name = self.rng.choice(sorted(FAULT_KINDS))
            kind = FAULT_KINDS[name]
            victim = self.rng.choice(kind.victims)
            try:
                pid = json.loads((self.run_dir / "processes.json").read_text())[victim]["pid"]
                if not psutil.Process(pid).name().startswith("ray::"):  # gone, and its pid taken since
                    continue
                fault = Fault(name, victim, pid, time.time())
                os.kill(pid, kind.signal)
            except (OSError, ValueError, psutil.Error):  # being replaced or restarted: the next one on time
                continue
            self.faults.append(fault)
            print(f"chaos: {name} ({victim}, pid {pid})", flush=True)
            if not kind.failure:
                time.sleep(SLOW_FOR_S)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)


def attribute(faults: list[Fault], failures: list[dict]) -> list[dict]:
    """Each recorded failure to the latest fault injected before it was seen; returns failures that no
    fault explains (spurious). A fault's first failure sets its detection time and how it was recovered."""
    spurious = []
    for failure in failures:
        before = [f for f in faults if f.at <= failure["detected_at"]]
        if not before:
            spurious.append(failure)
            continue
        fault = before[-1]
        if fault.detected_s is None:
            fault.detected_s = failure["detected_at"] - fault.at
            fault.recovered = "in place" if failure["replaced"] else "by restart"
    return spurious


def redone(metrics: Path) -> tuple[int, int]:
    """Iterations logged more than once (done again after a restart) and their env steps."""
    seen, again = set(), 0
    for line in metrics.read_text().splitlines():
        iteration = json.loads(line)["iteration"]
        again += iteration in seen
        seen.add(iteration)
    return again, again * STEPS_PER_ITERATION


def undisturbed_median_s(result: RunResult) -> float:
    """The median seconds of the run's iterations that no failure touched: how fast the machine ran it."""
    return statistics.median(h["time/iteration_s"] for h in result.history if "failures/replaced" not in h)


def iteration_times(result: RunResult) -> dict[str, list]:
    """Each iteration's seconds as the run logged it (an iteration redone after a restart: its last time),
    whether a failure touched it, and the mean return of the episodes that ended in it (None: none did)."""
    return {
        "seconds": [h["time/iteration_s"] for h in result.history],
        "touched": ["failures/replaced" in h for h in result.history],
        "returns": [h.get("env/episode_return") for h in result.history],
    }


def local_throughput(chaos_s: float, times: dict[str, list], outside_clean_s: float, speed: float) -> float:
    """The throughput with faults over the same run's without them, the machine's speed taken from the run
    itself: each iteration a failure touched costs its time over the median of the WINDOW undisturbed
    iterations on either side (the machine's speed then); the time outside iterations (start-up,
    checkpoints, restarts) costs what it exceeds the fault-free runs' by, scaled by `speed` (undisturbed
    iteration medians, with faults over without). A drift of the machine's speed between or within the
    runs, larger on this machine than what the faults cost, cancels."""
    seconds, touched = times["seconds"], times["touched"]
    cost = 0.0
    for i, took in enumerate(seconds):
        if touched[i]:
            near = range(max(0, i - WINDOW), min(len(seconds), i + WINDOW + 1))
            cost += max(0.0, took - statistics.median(seconds[j] for j in near if not touched[j]))
    cost += max(0.0, chaos_s - sum(seconds) - outside_clean_s * speed)
    return (chaos_s - cost) / chaos_s


def final_return(result: RunResult, share: float = 0.1) -> float:
    """The mean episode return over the last `share` of the iterations that reported one."""
    returns = [h["env/episode_return"] for h in result.history if "env/episode_return" in h]
    tail = returns[-max(1, int(len(returns) * share)) :]
    return statistics.fmean(tail) if tail else float("nan")


def run(spec: mf.WorkflowSpec) -> tuple[RunResult, float]:
    """The run and its wall time, in a Ray cluster of its own (nothing left over from the other run)."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        began = time.time()
        result = mf.run(spec)
        return result, time.time() - began
    finally:
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=600)
    parser.add_argument("--fault-every", type=float, default=60.0, help="seconds between faults")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--name", default="chaos")
    args = parser.parse_args()

    scratch = Path(args.out) / "tmp"
    shutil.rmtree(scratch, ignore_errors=True)  # the injector must not read an earlier run's files
    before, before_s = run(job(scratch, f"{args.name}-fault-free", args.iterations, args.seed))
    print(f"fault-free, before: {before.iterations} iterations in {before_s:.0f} s", flush=True)
    spec = job(scratch, args.name, args.iterations, args.seed)
    run_dir = Path(spec.run.output_dir) / spec.name
    with Injector(run_dir, args.fault_every, random.Random(args.seed)) as injector:
        chaotic, chaos_s = run(spec)
    print(f"with faults: {chaotic.iterations} iterations in {chaos_s:.0f} s", flush=True)
    after, after_s = run(job(scratch, f"{args.name}-fault-free-after", args.iterations, args.seed))
    print(f"fault-free, after: {after.iterations} iterations in {after_s:.0f} s", flush=True)
    runs = {"before": iteration_times(before), "chaos": iteration_times(chaotic), "after": iteration_times(after)}
    clean_s = statistics.fmean([before_s, after_s])
    clean_median_s = statistics.fmean([undisturbed_median_s(before), undisturbed_median_s(after)])
    faults = injector.faults
    spurious = attribute(faults, chaotic.failures)
    failures = [f for f in faults if FAULT_KINDS[f.kind].failure]
    detected = [f for f in failures if f.detected_s is not None]
    deadlines = Deadlines.from_plan(chaotic.plan, spec.run.timeouts)
    # the longest wait allowed: a phase's deadline, or a hung policy's simulators waiting out each other first
    bound_s = max(deadlines.phase_s.values()) + (1 + ENV_REPLICAS) * deadlines.channel_s
    again, steps_again = redone(run_dir / "metrics.jsonl")
    steps_in_place = sum(f["steps_redone"] for f in chaotic.failures)
    unaccounted = abs(
        chaotic.iterations * STEPS_PER_ITERATION - sum(h.get("actor/steps_consumed", 0) for h in chaotic.history)
    )
    clean_sps = args.iterations * STEPS_PER_ITERATION / clean_s
    chaos_sps = chaotic.iterations * STEPS_PER_ITERATION / chaos_s
    summary = {
        "iterations": args.iterations,
        "fault_every_s": args.fault_every,
        "faults": len(faults),
        "failures_injected": len(failures),
        "detected": len(detected),
        "detected_within_deadline": sum(f.detected_s <= bound_s for f in detected),
        "deadline_bound_s": bound_s,
        "slow_mistaken_for_failures": sum(
            1 for f in faults if not FAULT_KINDS[f.kind].failure and f.detected_s is not None
        ),
        "in_place": sum(f.recovered == "in place" for f in detected),
        "by_restart": sum(f.recovered == "by restart" for f in detected),
        "loop_faults_by_restart": sum(f.recovered == "by restart" for f in detected if FAULT_KINDS[f.kind].loop),
        "training_faults_by_restart": sum(
            f.recovered == "by restart" for f in detected if not FAULT_KINDS[f.kind].loop
        ),
        "spurious_failures": len(spurious),
        "iterations_redone": again,
        "env_steps_redone": steps_again + steps_in_place,
        "env_steps_unaccounted": unaccounted,
        "checkpoints_lost": checkpoints_lost(run_dir, range(chaotic.iterations)),
        "completed": all(r.iterations == args.iterations for r in (before, chaotic, after)),
        "fault_free_s": clean_s,  # the mean of the runs before and after
        "fault_free_runs_s": [before_s, after_s],
        "chaos_s": chaos_s,
        "fault_free_steps_per_s": clean_sps,
        "chaos_steps_per_s": chaos_sps,
        "throughput_ratio": chaos_sps / clean_sps,
        "throughput_ratio_against_before": chaos_sps * before_s / (args.iterations * STEPS_PER_ITERATION),
        "throughput_ratio_against_after": chaos_sps * after_s / (args.iterations * STEPS_PER_ITERATION),
        # the fault-free wall time scaled by how fast undisturbed iterations ran in each run
        "fault_free_iteration_median_s": clean_median_s,
        "chaos_undisturbed_iteration_median_s": undisturbed_median_s(chaotic),
        "throughput_ratio_drift_corrected": clean_s * undisturbed_median_s(chaotic) / clean_median_s / chaos_s,
        "throughput_ratio_local": local_throughput(
            chaos_s,
            runs["chaos"],
            statistics.fmean([before_s - sum(runs["before"]["seconds"]), after_s - sum(runs["after"]["seconds"])]),
            undisturbed_median_s(chaotic) / clean_median_s,
        ),
        "fault_free_return": final_return(before),
        "fault_free_after_return": final_return(after),
        "chaos_return": final_return(chaotic),
    }
    for fault in faults:
        print(json.dumps(asdict(fault)), flush=True)
    print(json.dumps(summary, indent=1), flush=True)
    payload = {"summary": summary, "faults": [asdict(f) for f in faults], "failures": chaotic.failures}
    save_result(args.name, {**payload, "iterations": runs}, args.out)
    slow = len(faults) - len(failures)
    print(f"slow replicas: {slow}, taken for failures: {summary['slow_mistaken_for_failures']}")
    print(
        f"chaos: {len(faults)} faults, {len(detected)} detected, {summary['in_place']} in place,"
        f" {summary['by_restart']} by restart, {summary['checkpoints_lost']} checkpoints lost,"
        f" throughput {share_down(summary['throughput_ratio'])} of fault-free"
    )
    sound = summary["completed"] and summary["detected"] == summary["failures_injected"]
    sound = sound and not (summary["checkpoints_lost"] or summary["spurious_failures"] or unaccounted)
    sys.exit(0 if sound else 1)


if __name__ == "__main__":
    main()
