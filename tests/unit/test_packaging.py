"""The wheel maps workers/ and planners/ into m2flow.* and holds every subpackage."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest

from tests.conftest import ROOT


@pytest.mark.timeout(600)
def test_wheel_holds_every_subpackage_and_imports(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        timeout=300,
    )
    wheel = next(tmp_path.glob("m2flow-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    packages = sorted({n.rsplit("/", 1)[0].replace("/", ".") for n in names if n.endswith("__init__.py")})
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    code = "import importlib, sys; print([importlib.import_module(p) for p in sys.argv[1:]][0].__file__)"
    out = subprocess.run(
        [sys.executable, "-c", code, *packages],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(str(site))
    for expected in ("m2flow.planners", "m2flow.workers.env", "m2flow.workers.actor", "m2flow.runtime", "m2flow.viz"):
        assert expected in packages
