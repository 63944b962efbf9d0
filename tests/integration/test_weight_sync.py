"""Sync edges on the real Ray cluster: a broadcast in the edge's own gloo group delivers what the object
store delivers; a transport the placement cannot carry stops the run before anything starts."""

from __future__ import annotations

import json

import pytest

import m2flow as mf
from m2flow.config import spec_from_dict
from m2flow.errors import PlanError
from tests.workflows import pendulum_ppo

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_cluster")]


def _workflow(tmp_path, transport: str) -> dict:
    raw = pendulum_ppo(tmp_path, f"sync-{transport}", num_envs=2, horizon=32, run={"iterations": 3, "seed": 2})
    raw["workers"]["env"]["replicas"] = 2
    raw["workers"]["rollout"]["replicas"] = 2  # a group of three: the actor and two inference replicas
    raw["flow"]["sync"][0]["transport"] = transport
    # a second edge from the same port, as the main job's evaluation: a group of its own (the actor and the first
    # env replica, the one that evaluates: the other is not sent the weights)
    raw["workers"]["env"]["args"]["evaluation"] = {"policy": {"env_id": "InvertedPendulum-v5"}, "max_steps": 50}
    raw["flow"]["sync"].append({"edge": "actor.weights -> env.evaluate", "every": 2, "transport": transport})
    return raw


def test_weights_broadcast_in_a_gloo_group_train_exactly_as_through_the_object_store(tmp_path):
    runs = {t: mf.run(spec_from_dict(_workflow(tmp_path, t))) for t in ("object_store", "collective")}
    store, group = runs["object_store"], runs["collective"]
    assert group.plan.transports == {
        "actor.weights -> rollout.load_weights": "collective",
        "actor.weights -> env.evaluate": "collective",
    }
    # the rollouts act with what they received: any bit lost would change the trajectories and the losses
    for key in ("actor/loss", "actor/approx_kl", "actor/grad_norm"):
        assert [h[key] for h in group.history] == [h[key] for h in store.history], key
    evaluated = [h["eval/return"] for h in group.history if "eval/return" in h]  # iterations 0 and 2
    assert len(evaluated) == 2 and evaluated == [h["eval/return"] for h in store.history if "eval/return" in h]
    assert group.last["actor/weights_version"] == 3.0
    assert group.last["sync/bytes"] >= store.last["sync/bytes"] * 0.9  # the whole state went through the group
    for run in (store, group):  # the evaluation's weights reached the replica that evaluates, and it alone
        events = json.loads((run.run_dir / "trace.json").read_text())["traceEvents"]
        assert {e["args"]["worker"] for e in events if e.get("name") == "evaluate"} == {"env[0]"}


def test_a_transport_the_placement_cannot_carry_is_refused_before_anything_starts(tmp_path):
    with pytest.raises(PlanError, match=r"flow.sync\[0\].transport: cuda_ipc needs every destination replica"):
        mf.run(spec_from_dict(_workflow(tmp_path, "cuda_ipc")))
