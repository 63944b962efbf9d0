"""What a user watches during a run: a progress bar, TensorBoard scalars, and metrics.jsonl."""

from __future__ import annotations

import json
import math
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

RETURN_KEY = "env/episode_return"


class Reporter:
    def __init__(self, run_dir: Path, total: int, start: int, show_progress: bool):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(run_dir / "tensorboard"))
        self.jsonl = open(run_dir / "metrics.jsonl", "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
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

    def log(self, iteration: int, env_steps: int, metrics: dict[str, float]) -> None:
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
        self.writer.close()
        self.jsonl.close()
