"""The learning tables of benchmarks/RESULTS.md: learning.py's and async.py's runs (return, time to a return,
env steps per second), and learning.py's runs merged from parts on different machines (returns only)."""

from __future__ import annotations

import statistics

from results_io import Results
from tables_format import Block, table


def every(args: dict) -> int:
    """The env steps between evaluations: the grid the implementations shared where the result records one
    (learning.py's `evaluation_grid`), else the interval asked for."""
    return args.get("evaluation_grid", args["eval_every"])


def learning(rel: str, res: Results) -> Block:
    """learning.py's and async.py's runs: one row per implementation or variant."""
    data = res.json(rel)
    steps = data["args"]["steps"]

    def seconds(values: list) -> str:
        reached = [v for v in values if v is not None]
        return f"{statistics.mean(reached):.0f} s ({len(reached)}/{len(values)} seeds)" if reached else "not reached"

    traced = any("busy" in run for run in data["runs"])  # async.py's runs say how busy each device was

    def busy(name: str) -> list[str]:
        if not traced:
            return []
        per_run = [run["busy"] for run in data["runs"] if run["implementation"] == name and "busy" in run]
        if not per_run:  # a peer: its processes are not traced
            return ["—"]
        devices = sorted({device for run in per_run for device in run})
        shares = {d: statistics.mean(run.get(d, 0.0) for run in per_run) for d in devices}
        return [", ".join(f"{d} {share:.0%}" for d, share in shares.items())]

    rows = [
        [
            name,
            f"{s['return_mean']:,.0f} ± {s['return_std']:,.0f}",
            ", ".join(f"{r:,.0f}" for r in s["returns"]),
            seconds(s["time_to_1000_s"]),
            seconds(s["time_to_1500_s"]),
            f"{s['steps_per_s']:,.0f}",
            *busy(name),
        ]
        for name, s in data["summary"].items()
    ]
    caption = (
        f"*{data['args']['env']}, {steps:,} env steps, seeds {data['args']['seeds']}, 10 deterministic episodes every"
        f" {every(data['args']):,} steps; wall time is training time (evaluations left out); `{data['line']}`*"
    )
    header = [
        "implementation",
        f"return at {steps:,} (mean ± std)",
        "per seed",
        "time to 1,000",
        "time to 1,500",
        "env steps/s (training)",
        *(["devices busy (mean over seeds)"] if traced else []),
    ]
    return Block([caption, "", *table(header, rows, "lrrrrr" + ("l" if traced else ""))], [rel])


def locomotion(rel: str, res: Results) -> Block:
    """learning.py's runs merged from parts run apart (`--merge`): returns only. The last evaluation within the
    step budget and the env steps it came at (m2flow evaluates every k iterations, so short of the budget
    where k does not divide them), and the mean of the last three (one evaluation of a policy that sometimes
    falls swings by hundreds)."""
    data = res.json(rel)
    steps = data["args"]["steps"]

    def evaluated(name: str) -> list[list[dict]]:  # each run's evaluations up to the step budget
        runs = [run for run in data["runs"] if run["implementation"] == name]
        return [[p for p in run["curve"] if p["steps"] <= steps] for run in runs]

    rows = []
    for name, s in data["summary"].items():
        curves = evaluated(name)
        tail = [statistics.mean(p["return"] for p in curve[-3:]) for curve in curves]
        rows.append(
            [
                name,
                f"{s['return_mean']:,.0f} ± {s['return_std']:,.0f}",
                ", ".join(f"{r:,.0f}" for r in s["returns"]),
                ", ".join(f"{at:,}" for at in sorted({curve[-1]["steps"] for curve in curves})),
                f"{statistics.mean(tail):,.0f} ± {statistics.pstdev(tail):,.0f}",
            ]
        )
    caption = (
        f"*{data['args']['env']}, {steps:,} env steps, seeds {data['args']['seeds']}, 10 deterministic episodes every"
        f" {every(data['args']):,} steps; `{data['line']}`*"
    )
    header = ["implementation", "last evaluation (mean ± std)", "per seed", "at env steps", "last 3 evaluations"]
    return Block([caption, "", *table(header, rows, "lrrrr")], [rel])
