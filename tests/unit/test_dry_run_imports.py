"""`m2flow validate` and `m2flow plan` are a dry run: on every config of configs/, in a fresh process, they
import no torch, gymnasium or MuJoCo, no transformers and no simulator package, so no env is built and no model
either (a Hugging Face policy is sized from its folder's files). One fresh process runs both, validate first:
what each imported is read after it, so plan starts as a fresh one would as far as these modules go."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ON_CPU

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))
HEAVY = ("torch", "gymnasium", "mujoco", "metaworld", "robosuite", "transformers")
# the task's sizes are not in the known tasks' table without robosuite installed: its plan stops there
NEEDS_A_MISSING_SIMULATOR = {"ppo_robosuite_camera.yaml": "needs robosuite"}

CHECK = """
import json, sys
from m2flow.cli import main
for argv in json.loads(sys.argv[1]):
    code = main(argv)
    print(json.dumps({"code": code, "imported": [m for m in HEAVY if m in sys.modules]}), flush=True)
    print(SEPARATOR, file=sys.stderr, flush=True)
"""
SEPARATOR = "---- m2flow dry run: next command ----"


def dry_runs(*commands: list[str]) -> list[dict]:
    """Each command (`m2flow` argv) run in turn in one fresh process: its exit code, the heavy modules
    imported once it ran, and its own stderr."""
    code = f"HEAVY = {HEAVY!r}\nSEPARATOR = {SEPARATOR!r}\n{CHECK}"
    args = [sys.executable, "-c", code, json.dumps(list(commands))]
    out = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    results = [json.loads(line) for line in out.stdout.splitlines() if line.startswith('{"code"')]
    stderrs = out.stderr.split(SEPARATOR + "\n")
    assert len(results) == len(commands) and len(stderrs) == len(commands) + 1, out.stdout + out.stderr
    return [{**result, "stderr": stderr} for result, stderr in zip(results, stderrs, strict=False)]


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory):
    """ppo_hf_tiny.yaml's model folder, written here (with torch, in this process: the dry runs are apart)."""
    from m2flow.workers.models.hf_tiny import make_tiny_vlm

    return make_tiny_vlm(tmp_path_factory.mktemp("models") / "tiny-vlm")


@pytest.mark.parametrize("config", CONFIGS)
def test_validate_and_plan_import_no_torch_gymnasium_or_mujoco_and_build_no_env(config, tmp_path, request):
    shrunk = ON_CPU.get(config, [])  # a GPU machine's config planned at a size this machine holds
    if config == "ppo_hf_tiny.yaml":  # an hf policy is sized from its folder's files: config, safetensors, tokenizer
        folder = request.getfixturevalue("tiny_vlm")
        shrunk = [f"workers.{w}.args.hf.path={folder}" for w in ("rollout", "actor")]
    validate = ["validate", f"configs/{config}", *shrunk]
    validated, planned = dry_runs(validate, ["plan", f"configs/{config}", *shrunk, "--out", str(tmp_path)])
    assert validated["code"] == 0 and validated["imported"] == [], validated["stderr"]
    if config in NEEDS_A_MISSING_SIMULATOR and planned["code"] != 0:
        assert NEEDS_A_MISSING_SIMULATOR[config] in planned["stderr"]
        assert not {"torch", "mujoco"} & set(planned["imported"])
        return
    assert planned["code"] == 0 and planned["imported"] == [], planned["stderr"]
