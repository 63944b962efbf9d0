"""benchmarks/hop_by_plan.py: each candidate runs from a copy of the calibration's cache that keeps the port costs
and leaves out the workflow's calibrated hop, so that the hop the copy holds after the run is that run's alone; a
candidate whose run fails is recorded and shown, and the sweep goes on."""

import importlib
from pathlib import Path
from types import SimpleNamespace

from m2flow.errors import WorkerError
from m2flow.graph import build_graph
from m2flow.planners.cache import load_calibration, save_calibration

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_a_candidate_s_cache_keeps_the_calibration_s_port_costs_without_its_hop(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    hops, accuracy = importlib.import_module("hop_by_plan"), importlib.import_module("planner_accuracy")
    main = accuracy.WORKLOADS["main"]
    calibrating = build_graph(accuracy.spec_of(main, tmp_path / "runs", "placement.mode=auto"))
    candidate = build_graph(  # another plan of the same workers: the run it is, not the workflow, differs
        accuracy.spec_of(main, tmp_path / "runs", "placement.mode=hybrid", "placement.pipeline_stages=2")
    )
    calibrated = tmp_path / "calibrated"
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(calibrated))
    save_calibration(calibrating, {"hop_item_s": 1e-5, "controller_s": 0.01})
    (calibrated / "env-costs.json").write_text("{}")  # a port-cost entry, as the calibrating run leaves them

    copy = hops.candidate_cache(calibrated, tmp_path / "candidate", candidate)

    assert (copy / "env-costs.json").exists()
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(copy))
    assert load_calibration(candidate) == {}
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(calibrated))
    assert load_calibration(candidate) == {"hop_item_s": 1e-5, "controller_s": 0.01}  # the calibration's, untouched


def test_a_candidate_whose_run_fails_is_recorded_and_shown_and_the_others_still_run(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    hops, io = importlib.import_module("hop_by_plan"), importlib.import_module("results_io")
    tables = importlib.import_module("tables_planner")
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(tmp_path / "unused"))  # bench points it at its own copies
    runs = []

    def run(spec):
        runs.append(spec.placement)
        if len(runs) == 2:  # the first candidate
            raise WorkerError("env[0] failed in step: ValueError")
        plan = SimpleNamespace(mode="shared", pipeline_stages=1, processes=[], label="shared S=1")
        return SimpleNamespace(plan=plan, history=[{"time/iteration_s": 9.0}] + [{"time/iteration_s": 1.0}] * 2)

    monkeypatch.setattr(hops.mf, "run", run)
    result = hops.bench("main", hops.WORKLOADS["main"], 3, 3, tmp_path)

    failed, *ran = result["rows"][1:]
    assert failed["failed"] == "env[0] failed in step: ValueError" and failed["plan"] == "shared S=1"
    assert len(ran) == len(runs) - 2 > 0 and all(row["measured_s"] == 1.0 for row in ran)
    payload = {"args": {"iterations": 3, "calibration_iterations": 3}, "workloads": [result], "summary": "s"}
    io.save_result("hop_by_plan", payload, tmp_path)
    text = "\n".join(tables.hop_by_plan("hop_by_plan.json", tables.PER_ITEM, io.Results(tmp_path)).lines)
    assert "| main | shared S=1 | failed |  |  |" in text
