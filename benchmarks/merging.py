"""Merged slices against slice-by-slice calls, side by side: a policy paid mostly per call (as one on a GPU is),
pipelined with a simulator in four slices on the 2-core machine.

The spin workers spend declared CPU time (`workers/synthetic.py`): a simulator of 8 envs at 0.5 ms an env on one
core, a policy costing 4 ms a call plus 0.1 ms a row on the other, hybrid S=4 (2 envs a slice). The same plan
runs with `placement.merge_slices=true` and `false`, in alternating rounds; each round's loop time is the median
of its iterations after the first. Predictions come from the declared costs and the defaults for the rest (a
cost cache of the benchmark's own, empty at each run: no run's measurements reach another), the plan's event
simulator merging as the loop does. The trace of the merged runs' first iterations says how many rows each
`act` call took.

    python benchmarks/merging.py [--rounds 2] [--iterations 6]

Writes benchmarks/results/merging.json. Last line: `merged/per-slice loop: <x>x (predicted <y>x)`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from collections import Counter
from pathlib import Path

from results_io import RESULTS, save_result

import m2flow as mf
from m2flow.config import spec_from_dict

ENVS, STEP_PER_ENV_S, ACT_S, ACT_PER_ROW_S = 8, 5e-4, 4e-3, 1e-4


def workflow(merge: bool, iterations: int, out: Path) -> mf.WorkflowSpec:
    return spec_from_dict(
        {
            "name": f"merging-{str(merge).lower()}",
            "workers": {
                "env": {
                    "kind": "simulator",
                    "class": "m2flow.workers.synthetic.SpinSimulator",
                    "args": {"num_envs": ENVS, "per_env_s": STEP_PER_ENV_S},
                    "profile": {"step": {"per_item_s": STEP_PER_ENV_S}},
                },
                "policy": {
                    "kind": "inference",
                    "class": "m2flow.workers.synthetic.SpinPolicy",
                    "args": {"fixed_s": ACT_S, "per_env_s": ACT_PER_ROW_S},
                    "profile": {"act": {"fixed_s": ACT_S, "per_item_s": ACT_PER_ROW_S}},
                },
                "trainer": {
                    "kind": "training",
                    "class": "m2flow.workers.synthetic.SpinTrainer",
                    "args": {"fixed_s": 0.02},
                    "profile": {"train": {"fixed_s": 0.02}},
                },
            },
            "flow": {
                "loop": {"horizon": 128, "edges": ["env.obs -> policy.act", "policy.act -> env.step"]},
                "then": ["env.trajectory -> trainer.train"],
                "sync": [{"edge": "trainer.weights -> policy.load_weights"}],
            },
            "placement": {
                "mode": "hybrid",
                "pipeline_stages": 4,
                "merge_slices": merge,
                "colocate": False,
                "replan": False,
            },
            "run": {
                "iterations": iterations,
                "checkpoint_every": 0,
                "progress": False,
                "output_dir": str(out),
            },
        }
    )


def act_rows(run_dir: Path) -> dict[int, int]:
    """How many traced `act` calls took how many rows."""
    events = json.loads((run_dir / "trace.json").read_text())["traceEvents"]
    return dict(
        sorted(Counter(e["args"]["items"] for e in events if e.get("cat") == "loop" and e["name"] == "act").items())
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory(prefix="m2flow-merging-") as tmp:
        for round_ in range(args.rounds):
            for merge in (True, False):
                os.environ["M2FLOW_COST_CACHE"] = str(Path(tmp) / f"cost-cache-{round_}-{merge}")  # empty
                result = mf.run(workflow(merge, args.iterations, Path(tmp) / f"{round_}"))
                ran = result.history[1:]
                run = {
                    "round": round_,
                    "merge": merge,
                    "merge_slices": result.plan.merge_slices,
                    "plan": f"{result.plan.mode} S={result.plan.pipeline_stages}",
                    "predicted_loop_s": result.plan.predicted.phase_s["loop"],
                    "predicted_iteration_s": result.plan.predicted.iteration_s,
                    "loop_s": statistics.median(h["time/loop_s"] for h in ran),
                    "iteration_s": statistics.median(h["time/iteration_s"] for h in ran),
                    "act_calls_by_rows": act_rows(result.run_dir),
                }
                runs.append(run)
                print(
                    f"round {round_} merge_slices={str(merge).lower():5s} loop {run['loop_s']:.3f} s (predicted"
                    f" {run['predicted_loop_s']:.3f} s, {run['loop_s'] / run['predicted_loop_s'] - 1:+.1%}),"
                    f" iteration {run['iteration_s']:.3f} s; traced act calls by rows {run['act_calls_by_rows']}",
                    flush=True,
                )

    def median_of(merge: bool, key: str) -> float:
        return statistics.median(r[key] for r in runs if r["merge"] is merge)

    ratio = median_of(False, "loop_s") / median_of(True, "loop_s")
    predicted = median_of(False, "predicted_loop_s") / median_of(True, "predicted_loop_s")
    iteration = median_of(False, "iteration_s") / median_of(True, "iteration_s")
    line = f"merged/per-slice loop: {ratio:.2f}x (predicted {predicted:.2f}x); iteration {iteration:.2f}x"
    save_result("merging", {"args": vars(args), "runs": runs, "line": line}, args.out)
    print(line)


if __name__ == "__main__":
    main()
