"""What a user watches during a run: a progress bar, TensorBoard scalars, and metrics.jsonl."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

RETURN_KEY = "env/episode_return"


class Reporter:
    """Iterations `start` on, of `total`, logged to the folder `run_dir`. A run that goes on from a checkpoint
    (resumed, or restarted after a failure: `rewind`) does the iterations after it again: what was logged of them
    (metrics.jsonl lines, TensorBoard scalars past the checkpoint's `start_env_steps`) goes when the first of them
    is logged again, that is once the checkpoint has loaded (a resume that fails leaves the logs as they were)."""

    def __init__(self, run_dir: Path, total: int, start: int, show_progress: bool, start_env_steps: int = 0):
        self.run_dir, self.start, self.start_env_steps = run_dir, start, start_env_steps
        self.writer = None  # opened by the first `log`
        self.jsonl = None
        self.console = Console(stderr=True)
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[sps]} steps/s"),
            TextColumn("return {task.fields[ret]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            disable=not show_progress,
        )
        self.task = self.progress.add_task("iteration", total=total, completed=start, sps="-", ret="-")
        self.progress.start()

    def rewind(self, start: int, start_env_steps: int) -> None:
        """Go on from iteration `start` (the checkpoint before it counted `start_env_steps`)."""
        self._close_files()
        self.start, self.start_env_steps = start, start_env_steps
        self.progress.update(self.task, completed=start)

    def _open(self) -> None:
        from torch.utils.tensorboard import SummaryWriter

        path, tensorboard = self.run_dir / "metrics.jsonl", self.run_dir / "tensorboard"
        if path.exists():
            _keep_before(path, self.start)
        earlier = tensorboard.is_dir() and any(tensorboard.iterdir())
        self.writer = SummaryWriter(str(tensorboard), purge_step=self.start_env_steps + 1 if earlier else None)
        self.jsonl = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def log(self, iteration: int, env_steps: int, metrics: dict[str, float]) -> None:
        if self.writer is None:
            self._open()
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and math.isfinite(value):
                self.writer.add_scalar(key, value, env_steps)
        self.writer.flush()
        self.jsonl.write(json.dumps({"iteration": iteration, "env_steps": env_steps, **metrics}) + "\n")
        self.jsonl.flush()
        sps = metrics.get("env/steps_per_s")
        ret = metrics.get(RETURN_KEY)
        self.progress.update(
            self.task,
            advance=1,
            sps=f"{sps:,.0f}" if sps else "-",
            ret=f"{ret:.1f}" if ret is not None and math.isfinite(ret) else "-",
        )

    def print(self, message) -> None:
        """A line (as written: a worker's error may hold brackets) or a rich table."""
        self.progress.console.print(message, markup=False, highlight=False)

    def close(self) -> None:
        self.progress.stop()
        self._close_files()

    def _close_files(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.jsonl.close()
            self.writer = self.jsonl = None


def _keep_before(path: Path, start: int) -> None:
    """Rewrite metrics.jsonl (atomically) with the lines of the iterations before `start` alone; a line a kill
    cut short is dropped with them."""
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("iteration"), int) and row["iteration"] < start:
            kept.append(line + "\n")
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(kept), encoding="utf-8")
    os.replace(tmp, path)
