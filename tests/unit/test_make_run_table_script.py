"""benchmarks/make_run_table.py: each run's end-of-run table is recorded as the run reported it (the iteration's
mean and median, its phases, the ports off their prediction), counted against the 10% target, and rendered."""

import importlib
import json
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from m2flow.runtime.run_record import RunResult
from m2flow.runtime.run_report import Compared, RunReport

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def result_of(predicted_s: float, measured: list[float], tmp_path: Path) -> RunResult:
    """A run whose iterations after the first were `measured`; its `env.step` measured 1.5x its prediction."""
    report = RunReport(
        iterations=len(measured),
        iteration_s=Compared(predicted_s, statistics.mean(measured)),
        median_iteration_s=statistics.median(measured),
        phase_s={"loop": Compared(0.1, 0.11), "then": Compared(0.15, 0.15)},
        port_s={"env.step": Compared(0.05, 0.075), "actor.train": Compared(0.14, 0.15)},
        device_busy={"n0/cpu0": Compared(0.8, 0.82)},
    )
    plan = SimpleNamespace(label="shared S=1 co-hosted")
    history = [{"iteration": 0, "time/iteration_s": 9.0}] + [{"time/iteration_s": s} for s in measured]
    return RunResult(tmp_path, plan, len(history), history=history, report=report)


def test_each_run_s_table_is_recorded_counted_against_the_target_and_rendered(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    script, io = importlib.import_module("make_run_table"), importlib.import_module("results_io")
    tables = importlib.import_module("tables_planner")
    results = iter([result_of(0.25, [0.26, 0.27, 0.28], tmp_path), result_of(0.25, [0.26, 0.26, 0.62], tmp_path)])
    specs = []
    monkeypatch.setattr(script.mf, "run", lambda spec: specs.append(spec) or next(results))
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(tmp_path / "unused"))  # main() points it at its own: restored after
    monkeypatch.setattr(sys, "argv", ["make_run_table.py", "--runs", "2", "--out", str(tmp_path), "run.iterations=4"])

    script.main()

    data = json.loads((tmp_path / "make_run_table.json").read_text())
    first, second = data["runs"]
    assert [s.run.iterations for s in specs] == [4, 4] and all(not s.run.progress for s in specs)
    assert first["measured_s"] == pytest.approx(0.27) and first["median_s"] == pytest.approx(0.27)
    assert second["measured_s"] == pytest.approx(0.38) and second["median_s"] == pytest.approx(0.26)
    assert first["error"] == pytest.approx(0.27 / 0.25 - 1) and first["ports_off"] == ["env.step"]
    assert data["summary"] == "make run's table: iteration within 10% of its prediction in 1/2 runs (+8.0%, +52.0%)"
    text = "\n".join(tables.make_run_table("make_run_table.json", io.Results(tmp_path)).lines)
    assert "| 2 | shared S=1 co-hosted | 0.250 | 0.380 | 0.260 | +52.0% |  | 0.100 / 0.110 | 0.150 / 0.150 |" in text
    assert data["summary"] in text
