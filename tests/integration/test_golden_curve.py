"""A golden learning curve: a short seeded PPO run whose per-iteration numbers are pinned as a test asset.
Any change that moves them (the algorithm, the env stepping, the batching) fails here and must be looked
at; a deliberate change re-pins them with `M2FLOW_WRITE_GOLDEN=1 pytest tests/integration/test_golden_curve.py`."""

from __future__ import annotations

import json
import os

import pytest

import m2flow as mf
from m2flow.config import spec_from_dict
from tests.conftest import ROOT
from tests.workflows import pendulum_ppo

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_cluster")]

GOLDEN = ROOT / "tests" / "assets" / "golden_pendulum_ppo.json"
KEYS = ("actor/loss", "actor/value_loss", "actor/approx_kl", "rollout/returns_mean", "env/episode_return")


def test_a_seeded_run_reproduces_its_pinned_learning_curve(tmp_path):
    raw = pendulum_ppo(
        tmp_path, "golden", hidden=[16, 16], horizon=64, actor={"num_minibatches": 4, "update_epochs": 2}
    )
    raw["run"].update(iterations=4, seed=11, checkpoint_every=0)
    raw["placement"] = {"mode": "shared", "pipeline_stages": 1}
    result = mf.run(spec_from_dict(raw))
    curve = [{key: h[key] for key in KEYS if key in h} for h in result.history]
    if os.environ.get("M2FLOW_WRITE_GOLDEN"):
        GOLDEN.write_text(json.dumps(curve, indent=1) + "\n")
    pinned = json.loads(GOLDEN.read_text())
    assert [sorted(c) for c in curve] == [sorted(p) for p in pinned]
    for it, (got, want) in enumerate(zip(curve, pinned, strict=True)):
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-3, abs=1e-5), f"iteration {it}: {key}"
