"""The layers of DESIGN.md hold: the declaration, the macro graph, the plan IR and the planners import
neither Ray nor torch (a dry run starts no cluster and loads no model), and the core never imports the
worker library."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT

PLANNING = [
    "m2flow.spec",
    "m2flow.config",
    "m2flow.cluster",
    "m2flow.contract",
    "m2flow.kinds",
    "m2flow.dispatch",
    "m2flow.sharding",
    "m2flow.graph",
    "m2flow.schedule",
    "m2flow.program",
    "m2flow.api",
    "m2flow.cli",
    "m2flow.viz",
]


def modules_loaded_by(modules: list[str]) -> set[str]:
    code = "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]; print(' '.join(sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code, *modules], capture_output=True, text=True, cwd=ROOT, timeout=120, check=True
    )
    return set(out.stdout.split())


def test_declaration_graph_plan_ir_and_planners_import_neither_ray_nor_torch():
    import m2flow.planners

    planners = [f"m2flow.planners.{m.name}" for m in pkgutil.iter_modules(m2flow.planners.__path__)]
    loaded = modules_loaded_by(PLANNING + planners)
    assert "m2flow.planners.simulate" in loaded
    assert not {"ray", "torch"} & loaded


@pytest.mark.parametrize("package", ["m2flow", "m2flow.runtime"])
def test_the_core_never_imports_the_worker_library(package):
    import importlib

    root = importlib.import_module(package)
    modules = [package] + [f"{package}.{m.name}" for m in pkgutil.iter_modules(root.__path__)]
    loaded = modules_loaded_by(modules)
    assert not {m for m in loaded if m.startswith("m2flow.workers")}
