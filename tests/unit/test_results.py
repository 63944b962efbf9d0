"""benchmarks/RESULTS.md is exactly what benchmarks/render_results.py renders from benchmarks/results/."""

import importlib
import json
import shutil
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def render_results(monkeypatch):
    """benchmarks/render_results.py, imported as its script runs: its sibling modules importable by name."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("render_results")


def test_results_md_matches_the_committed_raw_outputs(render_results, capsys):
    assert render_results.main(["--check"]) == 0, capsys.readouterr().out


def test_a_changed_number_in_a_raw_output_fails_the_check(render_results, tmp_path, capsys):
    results, doc = tmp_path / "results", tmp_path / "RESULTS.md"
    shutil.copytree(BENCHMARKS / "results", results)
    shutil.copy(BENCHMARKS / "RESULTS.md", doc)
    args = ["--results", str(results), "--doc", str(doc)]
    record = json.loads((results / "planner_scale.json").read_text())
    given = [r for r in record["rows"] if r["workers"] == 5 and not r["allocation"]]
    max(given, key=lambda r: r["gpus"])["plan_s"] = 9.99  # the figure's 1,024-GPU plan of 5 workers
    (results / "planner_scale.json").write_text(json.dumps(record, indent=1))

    assert render_results.main(["--check", *args]) == 1
    out = capsys.readouterr().out
    assert "table planner_scale differs" in out
    assert "figure planner.growth_5 differs" in out
    assert "table modes_spin" not in out

    assert render_results.main(args) == 0
    assert "| 5 | 1,024 | 128 | 9.99 s |" in doc.read_text()
    assert render_results.main(["--check", *args]) == 0


def test_a_missing_raw_output_is_named_without_a_traceback(render_results, tmp_path, capsys):
    results = tmp_path / "results"
    shutil.copytree(BENCHMARKS / "results", results)
    (results / "faults.json").unlink()

    assert render_results.main(["--check", "--results", str(results)]) == 2
    assert f"{results / 'faults.json'}: no such results file" in capsys.readouterr().err
