"""benchmarks/planner_accuracy.py: a candidate whose run fails is recorded with its error and run folder, and the
sweep's table shows it, rather than the sweep ending with nothing saved."""

import importlib
from pathlib import Path
from types import SimpleNamespace

import pytest

from m2flow.errors import WaitTimeout

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def benchmarks(monkeypatch):
    """The benchmarks folder's modules, imported as its scripts run: siblings importable by name."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return SimpleNamespace(
        accuracy=importlib.import_module("planner_accuracy"),
        tables=importlib.import_module("tables_planner"),
        io=importlib.import_module("results_io"),
    )


def test_a_failed_candidate_keeps_its_error_and_its_run_folder_without_checkpoints_in_place_of_an_earlier_one(
    benchmarks, tmp_path
):
    run_dir = tmp_path / "runs" / "ppo-metaworld-camera"
    (run_dir / "stacks").mkdir(parents=True)
    (run_dir / "stacks" / "host-123.txt").write_text('File "threading.py", line 331 in wait')
    (run_dir / "checkpoints" / "iter_00000001").mkdir(parents=True)
    planned = SimpleNamespace(predicted=SimpleNamespace(iteration_s=1.5), processes=[])
    error = WaitTimeout("waited 60s for the sync phase (iteration 0)")
    stale = tmp_path / "results" / "failed-ppo-metaworld-camera-hybrid-S2" / "from-an-earlier-sweep.txt"
    stale.parent.mkdir(parents=True)
    stale.write_text("")
    row = benchmarks.accuracy.failed_row("hybrid", 2, planned, error, run_dir, tmp_path / "results")
    kept = Path(row["kept"])
    assert kept == stale.parent and not stale.exists()  # replaced, not merged with an earlier sweep's
    assert (kept / "stacks" / "host-123.txt").read_text().endswith("in wait")
    assert not (kept / "checkpoints").exists()
    assert row["failed"] == str(error) and row["predicted_s"] == 1.5 and "measured_s" not in row


def test_a_co_hosted_candidate_keeps_its_run_folder_apart_from_the_plain_one(benchmarks, tmp_path):
    run_dir = tmp_path / "runs" / "ppo"
    run_dir.mkdir(parents=True)
    error = WaitTimeout("waited")
    names = {
        Path(benchmarks.accuracy.failed_row("shared", 2, plan, error, run_dir, tmp_path / "results")["kept"]).name
        for plan in (
            SimpleNamespace(predicted=SimpleNamespace(iteration_s=1.0), processes=[]),
            SimpleNamespace(predicted=SimpleNamespace(iteration_s=1.0), processes=[["env[0]", "env[1]"]]),
        )
    }
    assert names == {"failed-ppo-shared-S2", "failed-ppo-shared-S2-co-hosted"}


def test_the_accuracy_table_shows_a_failed_candidate_beside_the_measured_ones(benchmarks, tmp_path):
    rows = [
        {"mode": "shared", "stages": 1, "predicted_s": 1.0, "measured_s": 1.1, "error": 0.1, "auto": True},
        {"mode": "hybrid", "stages": 2, "predicted_s": 2.0, "failed": "waited 60s", "auto": False},
    ]
    payload = {"args": {"iterations": 5}, "workloads": [{"workload": "metaworld", "rows": rows}], "summary": "s"}
    benchmarks.io.save_result("planner_accuracy", payload, tmp_path)
    block = benchmarks.tables.planner_accuracy("planner_accuracy.json", benchmarks.io.Results(tmp_path))
    text = "\n".join(block.lines)
    assert "| metaworld | shared S=1 | 1.000 | 1.100 | +10.0% | auto |" in text
    assert "| metaworld | hybrid S=2 | 2.000 | failed |  |  |" in text
