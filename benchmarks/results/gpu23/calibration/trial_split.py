"""What the trial weighed on the H200 camera-ViT calibration: the recorded run's first three iterations refitted
as a run's first re-plan does, and the best plan under each of the trial's two splits.

    python benchmarks/results/gpu23/calibration/trial_split.py > benchmarks/results/gpu23/calibration/trial_split.txt
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from pathlib import Path

from m2flow.config import load_spec
from m2flow.graph import build_graph
from m2flow.planners import make_plan
from m2flow.planners.simulate import simulate
from m2flow.runtime.replan import REPLAN_AFTER, TRIAL_GAIN, Running, _split, refit
from m2flow.schedule import Plan

HERE = Path(__file__).resolve().parent


def main() -> None:
    os.environ["M2FLOW_COST_CACHE"] = tempfile.mkdtemp()  # as the calibrating run: no earlier run
    graph = build_graph(load_spec(HERE / "workflow.yaml", []))
    plan = Plan.from_dict(json.loads((HERE / "plan.initial.json").read_text()))
    events = json.loads(gzip.decompress((HERE / "trace.json.gz").read_bytes()))["traceEvents"]
    first = [e for e in events if e.get("args", {}).get("iteration", 0) < REPLAN_AFTER]
    measured = refit(graph, plan.cluster, first, Running(plan, 0, warmups=(0,)))
    print(f"running: {plan.mode} S={plan.pipeline_stages}; seen at one batch size: {', '.join(measured.unsplit)}")
    for port in measured.unsplit:
        items, mean_s, calls = measured.fitted[port]["by_size"][0]
        print(f"  {port}: {calls} calls of {items:g} items, {mean_s * 1e3:.3f} ms each")
    for per_call in (True, False):
        profile = _split(measured, per_call)
        best = make_plan(graph, plan.cluster, profile)
        current = simulate(graph, plan.placements, plan.pipeline_stages, profile, plan.phases, plan.processes)[0]
        gain = 1 - best.predicted.iteration_s / current.iteration_s
        print(
            f"all {'per call' if per_call else 'per item'}: best {best.mode} S={best.pipeline_stages}"
            f" {best.predicted.iteration_s:.3f} s vs running {current.iteration_s:.3f} s: {gain:.2%}"
            f" ({'tried' if gain >= TRIAL_GAIN else 'not tried'}: a trial needs {TRIAL_GAIN:.0%})"
        )


if __name__ == "__main__":
    main()
