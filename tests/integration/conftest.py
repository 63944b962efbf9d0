"""Integration tests run real workflows, which cache the port costs they measure: each test starts from
an empty cache of its own, so no test plans with what another one measured."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def cost_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(tmp_path / "cost-cache"))
    return tmp_path / "cost-cache"
