"""How long a replacement in place takes, with spare processes (`run.spares`) and without, side by side.

    python benchmarks/replacement.py [--iterations 140] [--first-after 40] [--every 8]

The chaos benchmark's job (InvertedPendulum PPO: 2 simulator processes, an inference process, 2 training
ranks, `run.on_failure: replace`) runs twice in one Ray cluster, spares off then on. In each run the same
processes are killed (SIGKILL) at the same times: a simulator, the inference process and a training rank,
the first `--first-after` seconds after the run has started its workers (the spares are ready by then:
they import at the lowest priority), then one every `--every` seconds. Reports, per fault, the seconds from
when the run saw the failure to the end of its replacement (and redo), and the faulted iteration's time
over the median iteration. Last line:

    replacement with spares/without: X.XXx shorter (mean time over the faults replaced in place in both runs)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

from chaos import job
from results_io import save_result

import m2flow as mf

VICTIMS = ("env[1]", "rollout[0]", "actor[0]")


def kill_in_turn(run_dir: Path, first_after_s: float, every_s: float, killed: list[dict]) -> threading.Thread:
    """A thread that kills each of VICTIMS in turn, the first `first_after_s` after processes.json appears."""

    def kill() -> None:
        processes = run_dir / "processes.json"
        while not processes.exists():
            time.sleep(0.05)
        time.sleep(first_after_s)
        for victim in VICTIMS:
            pid = json.loads(processes.read_text())[victim]["pid"]
            killed.append({"victim": victim, "pid": pid, "at": time.time()})
            os.kill(pid, signal.SIGKILL)
            time.sleep(every_s)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


def one_run(out: Path, spares: bool, args: argparse.Namespace) -> dict:
    spec = job(out, f"replacement-spares-{'on' if spares else 'off'}", args.iterations, args.seed)
    spec = spec.model_copy(update={"run": spec.run.model_copy(update={"spares": spares})})
    killed: list[dict] = []
    killer = kill_in_turn(Path(spec.run.output_dir) / spec.name, args.first_after, args.every, killed)
    result = mf.run(spec)
    killer.join(timeout=1)
    seconds = [h["time/iteration_s"] for h in result.history]
    median = statistics.median(seconds)
    faults = [
        {
            "victim": f["replaced"],
            "iteration": f["iteration"],
            "in_place": f["replaced"] is not None,
            "spare": f.get("spare", False),
            "replacement_s": f.get("seconds"),
            "iteration_excess_s": seconds[f["iteration"]] - median,
            "state": f["state"],
        }
        for f in result.failures
    ]
    return {"spares": spares, "killed": killed, "faults": faults, "iteration_median_s": median}


def compare(off: dict, on: dict) -> list[dict]:
    """The faults replaced in place in both runs, by victim, side by side."""
    rows = []
    for victim in VICTIMS:
        a = [f for f in off["faults"] if f["victim"] == victim and f["in_place"]]
        b = [f for f in on["faults"] if f["victim"] == victim and f["in_place"]]
        if a and b:
            rows.append(
                {
                    "victim": victim,
                    "without_s": a[0]["replacement_s"],
                    "with_s": b[0]["replacement_s"],
                    "ratio": a[0]["replacement_s"] / b[0]["replacement_s"],
                    "excess_without_s": a[0]["iteration_excess_s"],
                    "excess_with_s": b[0]["iteration_excess_s"],
                    "spare": b[0]["spare"],
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=140)
    parser.add_argument("--first-after", type=float, default=40.0)
    parser.add_argument("--every", type=float, default=8.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results/tmp/replacement")
    args = parser.parse_args()
    out = Path(args.out)
    runs = [one_run(out, spares, args) for spares in (False, True)]
    rows = compare(*runs)
    for row in rows:
        print(
            f"{row['victim']:>11}: {row['without_s']:.2f}s without spares, {row['with_s']:.2f}s with"
            f" ({row['ratio']:.1f}x; spare used: {row['spare']}); faulted iteration +{row['excess_without_s']:.2f}s"
            f" vs +{row['excess_with_s']:.2f}s"
        )
    if not rows:
        sys.exit("no fault was replaced in place in both runs: nothing to compare")
    mean_ratio = statistics.mean(r["without_s"] for r in rows) / statistics.mean(r["with_s"] for r in rows)
    save_result("replacement_spares", {"args": vars(args), "runs": runs, "rows": rows, "ratio": mean_ratio})
    print(f"replacement with spares/without: {mean_ratio:.2f}x shorter (mean time, {len(rows)} faults in both runs)")


if __name__ == "__main__":
    main()
