"""What a user runs, run as they would: the CLI on the main job (progress bar on), the README's Python
code, the examples as scripts, the camera configs and the locomotion presets — each at toy size."""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ON_CPU, ROOT

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_cluster")]


def run_script(code_or_path: str | Path, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    """A fresh Python process (its own Ray), as a user's shell would start it, from `cwd`."""
    args = [str(code_or_path)] if isinstance(code_or_path, Path) else ["-c", code_or_path]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_DEDUP_LOGS": "0"}
    out = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=cwd, timeout=timeout, env=env, check=False
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def test_the_cli_runs_the_main_job_with_its_progress_bar_and_evaluates_and_films_its_checkpoint(tmp_path):
    import imageio.v2 as imageio

    command = [
        str(Path(sys.executable).parent / "m2flow"),  # the console script a user runs
        "run",
        str(ROOT / "configs" / "ppo_mujoco.yaml"),
        "run.iterations=2",
        "flow.loop.horizon=16",
        "workers.env.args.evaluation.episodes=1",
        "workers.env.args.evaluation.max_steps=50",
        f"run.output_dir={tmp_path}",
        "run.progress=true",
    ]
    env = {**os.environ, "COLUMNS": "160"}
    out = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300, env=env, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    assert re.search(r"iteration .*2/2", out.stderr), out.stderr[-2000:]  # the progress bar, finished
    assert "done: 2 iterations" in out.stderr
    run_dir = tmp_path / "ppo-mujoco"
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["env_steps"] for line in lines] == [16 * 8, 2 * 16 * 8]
    for name in ("plan.json", "workflow.yaml", "trace.json"):
        assert (run_dir / name).stat().st_size > 0, name
    assert any((run_dir / "tensorboard").iterdir())
    assert (run_dir / "checkpoints" / "iter_00000001" / "meta.json").exists()
    assert json.loads(lines[0])["eval/length"] == 50  # the evaluation sync edge ran at iteration 0
    report = json.loads((run_dir / "report.json").read_text())  # the end-of-run table's numbers
    measured = [json.loads(line)["time/iteration_s"] for line in lines[1:]]  # the first warms up
    assert report["iterations"] == len(measured) == 1
    assert report["iteration_s"]["measured"] == pytest.approx(statistics.mean(measured))
    assert report["median_iteration_s"] == pytest.approx(statistics.median(measured))
    assert report["iteration_s"]["predicted"] > 0 and set(report["phase_s"]) == {"sync", "loop", "then"}
    for port in ("env.step", "rollout.act", "actor.train"):
        assert report["port_s"][port]["predicted"] > 0 and report["port_s"][port]["measured"] > 0, port
    assert all(0 < busy["measured"] <= 1 for busy in report["device_busy"].values()), report["device_busy"]
    evaluate = [command[0], "eval", str(run_dir), "--episodes", "2", "--video"]
    out = subprocess.run(evaluate, capture_output=True, text=True, cwd=ROOT, timeout=300, env=env, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.search(r"eval: 2 deterministic episode\(s\) of iter_00000001: return -?[\d.]+ ± [\d.]+", out.stderr)
    videos = run_dir / "eval" / "videos" / "env"
    assert f"videos in {videos}" in " ".join(out.stderr.split())  # the console wraps long lines
    filmed = sorted(videos.iterdir())  # the checkpoint's weights are version 2 (two updates)
    assert [v.name for v in filmed] == [f"eval_v00002_episode{e}.mp4" for e in (0, 1)]
    frames = imageio.mimread(filmed[0])
    assert len(frames) == 50 and frames[0].shape == (240, 320, 3)  # the evaluation's 50 steps, VideoConfig's size


def readme_python_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


TOY_SIZE = {"iterations=50": "iterations=2", "horizon=256": "horizon=16"}


def test_the_readme_python_code_runs_as_written_at_toy_size(tmp_path):
    blocks = readme_python_blocks()
    assert len(blocks) >= 2
    code = "\n".join(blocks)
    for big, small in TOY_SIZE.items():
        assert big in code, f"the README example no longer says {big}: update TOY_SIZE"
        code = code.replace(big, small)
    out = run_script(code, tmp_path)
    first_line = out.stdout.strip().splitlines()[0]
    value, run_dir = first_line.split(" ", 1)
    assert value == "None" or float(value) == float(value)  # a return, or None if no episode ended yet
    assert Path(tmp_path / run_dir).is_dir() or Path(run_dir).is_dir()


EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.py") if p.name != "__init__.py")


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.name)
def test_every_example_runs_as_a_script(script, tmp_path):
    out = run_script(script, tmp_path)
    assert "outputs in" in out.stdout


TOY_SIZE_CONFIGS = [
    "ppo_camera.yaml",
    "ppo_metaworld_camera.yaml",
    "ppo_mujoco_camera.yaml",
    "ppo_hopper.yaml",
    "ppo_walker2d.yaml",
    "ppo_ant.yaml",
    "ppo_camera_gpu.yaml",  # shrunk (tests/conftest.py ON_CPU)
    "ppo_camera_gpu_async.yaml",  # shrunk too; its one iteration fills the queue, the update follows alone
]


@pytest.mark.parametrize("config", TOY_SIZE_CONFIGS)
def test_the_camera_and_locomotion_configs_run_an_iteration(config, tmp_path):
    import m2flow as mf

    toy = ["run.iterations=1", "flow.loop.horizon=4", f"run.output_dir={tmp_path}", "run.progress=false"]
    toy += ["run.checkpoint_every=0", *ON_CPU.get(config, [])]
    evaluates = bool(mf.load_spec(ROOT / "configs" / config, toy).workers["env"].args.get("evaluation"))
    if evaluates:  # its first iteration also evaluates (and films): in episodes of a few steps here
        toy += ["workers.env.args.evaluation.episodes=1", "workers.env.args.evaluation.max_steps=8"]
    result = mf.run(mf.load_spec(ROOT / "configs" / config, toy))
    assert result.iterations == 1
    assert result.last["accounting/steps_produced"] > 0
    assert ("eval/return" in result.last) == evaluates


def test_a_camera_run_evaluates_from_its_checkpoint_and_one_that_normalised_otherwise_is_refused_or_hung_named(
    tmp_path, monkeypatch, capsys
):
    """`m2flow eval`'s path on the camera preset (its statistics restored and read frozen: test_camera_env.py); a
    checkpoint whose simulator normalised nothing, evaluated as normalising, is refused naming the key; an
    evaluation that hangs is given up at `--timeout`."""
    import time

    import m2flow as mf
    from m2flow import cli
    from m2flow.errors import SpecError
    from m2flow.offline import evaluate_run
    from m2flow.workers.env import CameraEnv

    def trained(normalize: bool) -> Path:
        settings = ["run.iterations=2", "flow.loop.horizon=4", "run.checkpoint_every=1", "run.progress=false"]
        settings += [f"run.output_dir={tmp_path / str(normalize)}", f"workers.env.args.normalize_obs={normalize}"]
        settings += ["workers.env.args.evaluation.max_steps=20"]
        mf.run(mf.load_spec(ROOT / "configs" / "ppo_mujoco_camera.yaml", settings))
        return tmp_path / str(normalize) / "ppo-mujoco-camera"

    run_dir = trained(True)
    evaluation = evaluate_run(run_dir, episodes=2)
    assert evaluation.metrics["eval/length"] == 20 and math.isfinite(evaluation.metrics["eval/return"])
    monkeypatch.setattr(CameraEnv, "evaluate", lambda self, weights: time.sleep(60))
    began = time.monotonic()
    assert cli.main(["eval", str(run_dir), "--episodes", "1", "--timeout", "2"]) == 2
    assert time.monotonic() - began < 30
    said = " ".join(capsys.readouterr().err.split())
    assert f"m2flow eval: 1 episode(s) of {run_dir} did not finish within 2 s" in said and "Traceback" not in said
    monkeypatch.undo()
    raw = trained(False)
    (raw / "workflow.yaml").write_text((raw / "workflow.yaml").read_text().replace("normalize_obs: false", ""))
    with pytest.raises(SpecError, match=r"normalize_obs: the checkpoint's simulator did not normalise .* false"):
        evaluate_run(raw, episodes=1)


def test_the_hf_tiny_config_trains_three_iterations_and_m2flow_export_writes_a_policy_that_loads(tmp_path):
    """configs/ppo_hf_tiny.yaml after its setup step (the tiny VLM written to a folder): PPO over a VLM;
    then `m2flow export` of the run, loaded again as an inference worker's policy."""
    import m2flow as mf
    from m2flow.workers.models.hf_tiny import make_tiny_vlm

    model = make_tiny_vlm(tmp_path / "tiny-vlm")
    spec = mf.load_spec(
        ROOT / "configs" / "ppo_hf_tiny.yaml",
        [f"workers.{w}.args.hf.path={model}" for w in ("rollout", "actor")]
        + [f"run.output_dir={tmp_path}", "run.progress=false"],
    )
    result = mf.run(spec)
    assert [h["iteration"] for h in result.history] == [0, 1, 2]
    assert all(math.isfinite(h["actor/loss"]) for h in result.history)
    assert result.last["actor/weights_version"] == 3.0
    from m2flow.cli import main
    from m2flow.context import WorkerContext, set_context
    from m2flow.workers.rollout import TorchPolicy

    assert main(["export", str(result.run_dir), "--to", str(tmp_path / "exported")]) == 0
    policy = {**spec.workers["rollout"].args}
    policy["hf"] = {**policy["hf"], "path": str(tmp_path / "exported")}
    set_context(WorkerContext(worker="rollout", kind="inference", seed=1))
    actions = TorchPolicy(**policy).act({"rgb": np.zeros((2, 1, 32, 32, 3), np.uint8), "env_id": np.arange(2)})
    assert np.isfinite(actions["action"]).all()
