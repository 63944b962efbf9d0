"""What a worker class may declare of some of its ports (`m2flow/contract.py`): `batch_invariant` and
`rendering_ports` name ports it has, and only a simulator renders."""

from __future__ import annotations

import pytest

from m2flow.contract import describe_worker
from m2flow.spec import WorkerSpec


def act(self, obs):
    return obs


@pytest.mark.parametrize("declaration", ["batch_invariant", "rendering_ports"])
def test_a_declared_port_the_class_lacks_is_refused_naming_the_declaration_the_class_and_its_ports(declaration):
    declares = type("Declares", (), {declaration: frozenset({"act", "ack"}), "act": act})
    spec = WorkerSpec.model_validate({"kind": "simulator", "class": "my.Declares"})
    info, problems = describe_worker("env", spec, declares)
    assert info is None
    assert problems == [f"workers.env: my.Declares.{declaration}: 'ack' is not one of its ports (act)"]


def test_rendering_ports_on_a_worker_of_a_kind_that_does_not_render_are_refused_naming_the_kind_and_the_fix():
    declares = type("Declares", (), {"rendering_ports": frozenset({"act"}), "act": act})
    spec = WorkerSpec.model_validate({"kind": "inference", "class": "my.Declares"})
    info, problems = describe_worker("policy", spec, declares)
    assert info is None
    assert problems == [
        "workers.policy: my.Declares.rendering_ports: only a simulator worker renders cameras, and this worker's kind"
        " is 'inference'; set workers.policy.kind: simulator, or remove the declaration"
    ]
