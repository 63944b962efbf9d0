"""The CLI as a user meets it: exit codes, no tracebacks for user errors, the dry run's files."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import ROOT


def m2flow(*args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    code = (
        "import sys; from m2flow.cli import main; rc = main(sys.argv[1:]);"
        " sys.exit(rc if 'ray' not in sys.modules or sys.argv[1] == 'run' else 99)"
    )
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def test_validate_reports_every_problem_without_traceback(tmp_path, config_path):
    bad = tmp_path / "bad.yaml"
    text = re.sub(r"horizon: \d+", "horizon: lots", config_path.read_text().replace("replicas: 2", "replicas: -1"))
    bad.write_text(text)
    out = m2flow("validate", str(bad))
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert "workers.env.replicas" in out.stderr and "flow.loop.horizon" in out.stderr and str(bad) in out.stderr


def test_validate_accepts_the_main_config(config_path):
    out = m2flow("validate", str(config_path))
    assert out.returncode == 0, out.stderr
    assert "valid" in out.stderr


def test_dry_run_writes_plan_pictures_and_starts_no_ray(tmp_path, config_path):
    out = m2flow("plan", str(config_path), "--dry-run", "--out", str(tmp_path), "cluster.cpus=4", "cluster.gpus=0")
    assert out.returncode == 0, out.stderr
    for name in ("plan.json", "graph.dot", "graph.svg", "gantt.png", "gantt.html"):
        assert (tmp_path / name).stat().st_size > 0, name
    assert "placement" in out.stdout and "candidates" in out.stdout


def test_an_impossible_placement_is_a_clean_error(config_path):
    out = m2flow("plan", str(config_path), "placement.mode=disaggregated", "cluster.cpus=2", "cluster.gpus=0")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "need disjoint devices but only 2 exist" in out.stderr
