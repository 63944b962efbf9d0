"""Write a benchmark's raw output as benchmarks/results/<name>.json, stamped with what produced it."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shutil
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"


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
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
