"""What a run logs of its iterations: each once in metrics.jsonl and TensorBoard, a restart's redone ones too."""

from __future__ import annotations

import json
import time

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from m2flow.runtime.reporting import Reporter

# TensorBoard reads a folder's event files in the order of their names, which start with the second they were
# opened (then a per-process counter, compared as text): a run goes on from a checkpoint seconds after it logged
EVENT_FILE_CLOCK_S = 1.1


def logged(run_dir) -> tuple[list[int], list[int]]:
    """The iterations metrics.jsonl holds, and the steps of TensorBoard's `loss` scalar."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    scalars = EventAccumulator(str(run_dir / "tensorboard")).Reload().Scalars("loss")
    return [line["iteration"] for line in lines], [s.step for s in scalars]


def test_a_restart_from_a_checkpoint_logs_the_iterations_it_does_again_once(tmp_path):
    reporter = Reporter(tmp_path, total=4, start=0, show_progress=False)
    for it in range(3):
        reporter.log(it, 10 * (it + 1), {"loss": float(it)})
    time.sleep(EVENT_FILE_CLOCK_S)
    reporter.rewind(2, 20)  # iteration 2 failed after it was logged; the checkpoint of iteration 1 counted 20 steps
    for it in (2, 3):
        reporter.log(it, 10 * (it + 1), {"loss": float(it)})
    reporter.close()
    assert logged(tmp_path) == ([0, 1, 2, 3], [10, 20, 30, 40])


def test_a_resumed_run_drops_what_an_earlier_run_logged_after_its_checkpoint_once_it_logs(tmp_path):
    first = Reporter(tmp_path, total=3, start=0, show_progress=False)
    for it in range(3):
        first.log(it, 10 * (it + 1), {"loss": float(it)})
    first.close()
    with (tmp_path / "metrics.jsonl").open("a") as cut_short:
        cut_short.write('{"iteration": 3, "env_')  # a kill while writing
    before = (tmp_path / "metrics.jsonl").read_bytes()
    time.sleep(EVENT_FILE_CLOCK_S)
    resumed = Reporter(tmp_path, total=4, start=1, show_progress=False, start_env_steps=10)
    resumed.print("restoring")  # a resume that fails here leaves the log as it was
    assert (tmp_path / "metrics.jsonl").read_bytes() == before
    for it in (1, 2, 3):
        resumed.log(it, 10 * (it + 1), {"loss": float(it)})
    resumed.close()
    assert logged(tmp_path) == ([0, 1, 2, 3], [10, 20, 30, 40])
