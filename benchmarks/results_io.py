"""The results folder's format: a benchmark's raw output written as benchmarks/results/<name>.json with a
`meta` block saying what produced it (save_result), and read back with that block (Results)."""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"


class ResultsError(Exception):
    """A results file is missing, or lacks what its reader needs (its `meta` block, a row)."""


def save_result(name: str, payload: dict, folder: Path | str = RESULTS) -> Path:
    """Write `payload` to `<folder>/<name>.json` with a leading `meta` block (commit, UTC date, machine).

    The file is written to a temporary file in the same folder and renamed over the target, so a reader
    (or `render_results.py`) never sees half a result. Keys the payload puts in its own `meta` are kept
    and win over the stamped ones. Returns the path written.
    """
    path = Path(folder) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"commit": _commit(), "date": datetime.datetime.now(datetime.UTC).date().isoformat(), "machine": machine()}
    body = {key: value for key, value in payload.items() if key != "meta"}
    record = {"meta": {**meta, **payload.get("meta", {})}, **body}
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as tmp:
        try:
            json.dump(record, tmp, indent=1)
            tmp.flush()
            os.fsync(tmp.fileno())
        except BaseException:
            os.unlink(tmp.name)
            raise
    os.chmod(tmp.name, 0o644)  # NamedTemporaryFile creates it private
    os.replace(tmp.name, path)
    return path


def save_meta(jsonl: Path | str) -> Path:
    """Stamp a .jsonl results file (a run's metrics) with a `meta` block beside it, in `<stem>.meta.json`."""
    path = Path(jsonl)
    return save_result(f"{path.stem}.meta", {}, path.parent)


def machine() -> str:
    """A short description such as "x86_64, 2 cores, 24 GiB, no GPU" (no host name)."""
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{platform.machine()}, {os.cpu_count()} cores, {memory_gib:.0f} GiB, {_gpus()}"


def _gpus() -> str:
    """The GPUs as nvidia-smi names them, e.g. "2x NVIDIA H200"; "no GPU" where it is absent."""
    if shutil.which("nvidia-smi") is None:
        return "no GPU"
    try:
        names = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return "GPU unknown (nvidia-smi failed)"
    counts = Counter(n.strip() for n in names if n.strip())
    return " + ".join(f"{count}x {name}" for name, count in counts.items()) or "no GPU"


def _commit() -> str:
    """HEAD here, or M2FLOW_RESULTS_COMMIT where the code that ran came from elsewhere (a wheel on the device)."""
    if os.environ.get("M2FLOW_RESULTS_COMMIT"):
        return os.environ["M2FLOW_RESULTS_COMMIT"]
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


class Results:
    """The raw outputs under one results folder, each file read once."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._cache: dict[str, object] = {}

    def _read(self, rel: str, parse: Callable[[str], object]) -> object:
        if rel not in self._cache:
            path = self.folder / rel
            if not path.is_file():
                raise ResultsError(f"{path}: no such results file; re-run its benchmark or fix the name here")
            self._cache[rel] = parse(path.read_text())
        return self._cache[rel]

    def json(self, rel: str) -> dict:
        return self._read(rel, json.loads)

    def jsonl(self, rel: str) -> list[dict]:
        return self._read(rel, lambda text: [json.loads(line) for line in text.splitlines() if line.strip()])

    def text(self, rel: str) -> str:
        return self._read(rel, str)

    def rows(self, rel: str) -> list[dict]:
        return self.json(rel)["rows"]

    def raw_line(self, rel: str) -> str:
        """`raw: <file>, commit <c>, <date>, <machine>`; a .jsonl keeps its meta in `<stem>.meta.json` beside it."""
        meta_file = rel.removesuffix(".jsonl") + ".meta.json" if rel.endswith(".jsonl") else rel
        meta = self.json(meta_file).get("meta")
        if meta is None:
            raise ResultsError(f"{self.folder / meta_file}: no `meta` block; write it with results_io.save_result")
        line = f"raw: benchmarks/results/{rel}, commit {meta['commit']}, {meta['date']}, {meta['machine']}"
        return line + (f" ({meta['meta_source']})" if "meta_source" in meta else "")


if __name__ == "__main__":  # python benchmarks/results_io.py RUN_metrics.jsonl ...: stamp copied metrics files
    for arg in sys.argv[1:]:
        print(save_meta(arg))


def share_down(ratio: float) -> str:
    """A ratio as a percentage to one decimal, rounded down: 0.89995 reads 89.9%, never 90.0% (a target
    of 90% is met only when the raw ratio meets it)."""
    return f"{math.floor(ratio * 1000) / 10:.1f}%"
