"""benchmarks/hop_by_plan.py: each candidate runs from a copy of the calibration's cache that keeps the port costs
and leaves out the workflow's calibrated hop, so that the hop the copy holds after the run is that run's alone."""

import importlib
from pathlib import Path

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
    save_calibration(calibrating, {"hop_s": 0.001, "controller_s": 0.01})
    (calibrated / "env-costs.json").write_text("{}")  # a port-cost entry, as the calibrating run leaves them

    copy = hops.candidate_cache(calibrated, tmp_path / "candidate", candidate)

    assert (copy / "env-costs.json").exists()
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(copy))
    assert load_calibration(candidate) == {}
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(calibrated))
    assert load_calibration(candidate) == {"hop_s": 0.001, "controller_s": 0.01}  # the calibration's, untouched
