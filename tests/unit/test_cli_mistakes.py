"""Mistakes a user meets at the command line: a folder that cannot be made, a missing file, a cluster that does
not answer, files `eval` and `profile --from-trace` cannot read; each named, with no traceback, nothing written."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT


def cli(*args: str) -> subprocess.CompletedProcess:
    """The CLI in a subprocess; exit code 99 where it left a Ray cluster started."""
    code = (
        "import sys; from m2flow.cli import main; rc = main(sys.argv[1:]);"
        " sys.exit(99 if 'ray' in sys.modules and sys.modules['ray'].is_initialized() else rc)"
    )
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT, timeout=300)


@pytest.mark.parametrize("command", ["plan", "profile", "run"])
def test_an_output_folder_that_cannot_be_made_is_named_before_anything_starts(tmp_path, config_path, command):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    option = {
        "plan": ["--out", str(blocker / "out")],
        "profile": ["--out", str(blocker / "out" / "profile.json")],
        "run": [f"run.output_dir={blocker / 'out'}"],
    }[command]
    out = cli(command, str(config_path), *option)
    assert out.returncode == 2, out.stderr[-2000:]  # 99: a cluster was started first
    assert "Traceback" not in out.stderr
    key = "run.output_dir" if command == "run" else "--out"
    assert f"{key}: cannot make the folder {blocker / 'out'}" in " ".join(out.stderr.split())


def test_a_command_without_its_file_asks_for_the_file_only():
    out = cli("run")
    assert out.returncode == 2
    assert out.stderr.strip().endswith("error: the following arguments are required: file")


def test_a_cluster_address_where_nothing_answers_is_named_at_once_not_retried_for_minutes(config_path, tmp_path):
    started = time.monotonic()
    out = cli("run", str(config_path), "--address", "127.0.0.1:1", f"run.output_dir={tmp_path}")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "cluster.address: nothing answers at 127.0.0.1:1 (Connection refused) within 10s" in out.stderr
    assert time.monotonic() - started < 60


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["eval", "{tmp}", "--episodes", "0"], "argument --episodes: expected at least 1, got 0"),
        (["eval", "{tmp}"], "{tmp}: not a run's folder (no workflow.yaml); give <run.output_dir>/<name>"),
        (["profile", "{config}", "--from-trace", "{tmp}/none.json"], "--from-trace: cannot read {tmp}/none.json"),
        (["profile", "{config}", "--from-trace", "{tmp}/bad.json"], "--from-trace: {tmp}/bad.json is not a trace"),
        (["profile", "{config}", "--from-trace", "{tmp}/other.json"], "holds no call of this workflow's ports"),
    ],
    ids=["no episodes", "not a run", "no trace file", "not JSON", "another workflow's trace"],
)
def test_eval_and_a_refit_given_what_they_cannot_read_say_so_without_a_traceback(tmp_path, config_path, args, said):
    (tmp_path / "bad.json").write_text("{not json")
    spin_trace = (ROOT / "benchmarks" / "results" / "spin_per_call_shared_s4_cohosted_trace.json").read_text()
    (tmp_path / "other.json").write_text(spin_trace.replace('"env[', '"sim[').replace('"policy[', '"actor0['))
    fill = {"tmp": str(tmp_path), "config": str(config_path)}
    into_tmp = [f"run.output_dir={tmp_path}"] if args[0] == "profile" else []
    out = cli(*(arg.format(**fill) for arg in args), *into_tmp)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert said.format(**fill) in " ".join(out.stderr.split())
    assert list(tmp_path.glob("profiles/*.json")) == []  # no profile written
