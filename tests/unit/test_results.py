"""benchmarks/RESULTS.md is exactly what benchmarks/render_results.py renders from benchmarks/results/."""

import importlib.util
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _render_results():
    spec = importlib.util.spec_from_file_location("render_results", ROOT / "benchmarks" / "render_results.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def test_results_md_matches_the_committed_raw_outputs(capsys):
    assert _render_results().main(["--check"]) == 0, capsys.readouterr().out


def test_a_changed_number_in_a_raw_output_fails_the_check(tmp_path, capsys):
    render_results = _render_results()
    results, doc = tmp_path / "results", tmp_path / "RESULTS.md"
    shutil.copytree(ROOT / "benchmarks" / "results", results)
    shutil.copy(ROOT / "benchmarks" / "RESULTS.md", doc)
    args = ["--results", str(results), "--doc", str(doc)]
    record = json.loads((results / "planner_scale.json").read_text())
    record["rows"][-1]["plan_s"] = 9.99
    (results / "planner_scale.json").write_text(json.dumps(record, indent=1))

    assert render_results.main(["--check", *args]) == 1
    out = capsys.readouterr().out
    assert "table planner_scale differs" in out
    assert "figure planner.growth_5 differs" in out
    assert "table modes_spin" not in out

    assert render_results.main(args) == 0
    assert "| 5 | 1,024 | 128 | 9.99 s |" in doc.read_text()
    assert render_results.main(["--check", *args]) == 0
