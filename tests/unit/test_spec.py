"""The declaration layer: YAML <-> spec round trip, overrides, and errors that name the key."""

from __future__ import annotations

import pytest
import yaml

import m2flow as mf
from m2flow.config import apply_overrides, dump_spec, load_spec, spec_from_dict
from m2flow.errors import SpecError
from m2flow.graph import build_graph
from m2flow.workers.actor import PPO
from m2flow.workers.env import GymEnv
from m2flow.workers.rollout import TorchPolicy
from tests.conftest import ROOT


def _raw(config_path) -> dict:
    return yaml.safe_load(config_path.read_text())


def _problems(raw: dict) -> str:
    with pytest.raises(SpecError) as info:
        build_graph(spec_from_dict(raw, "wf.yaml"), "wf.yaml")
    return str(info.value)


def test_yaml_round_trip_is_lossless(config_path):
    spec = load_spec(config_path)
    again = spec_from_dict(yaml.safe_load(dump_spec(spec)))
    assert again == spec
    assert str(again.flow.loop.edges[0]) == "env.obs -> rollout.act"


def test_python_api_builds_the_same_spec_as_yaml(config_path):
    from_yaml = load_spec(config_path)
    args = {name: worker.args for name, worker in from_yaml.workers.items()}
    env = mf.define_worker("env", GymEnv, kind="simulator", replicas=2, args=args["env"])
    rollout = mf.define_worker("rollout", TorchPolicy, kind="inference", args=args["rollout"])
    actor = mf.define_worker(
        "actor", PPO, kind="training", backend="fsdp", replicas=1, resources={"threads": "auto"}, args=args["actor"]
    )
    wf = mf.Workflow("ppo-mujoco", workers=[env, rollout, actor])
    wf.loop(env.port("obs") >> rollout.port("act"), rollout.port("act") >> env.port("step"), horizon=64)
    wf.then(env.port("trajectory") >> actor.port("train"))
    wf.sync(actor.port("weights") >> rollout.port("load_weights"))
    wf.sync(actor.port("weights") >> env.port("evaluate"), every=49)
    wf.placement(mode="auto", pipeline_stages=1)
    spec = wf.spec(iterations=196, seed=1, output_dir="runs", checkpoint_every=49)
    classes = {"workers": {"env": {"cls"}, "rollout": {"cls"}, "actor": {"cls"}}}
    assert spec.model_dump(exclude=classes) == from_yaml.model_dump(exclude=classes)
    assert build_graph(spec).loop.horizon == 64


def test_overrides_set_nested_keys_and_parse_values(config_path):
    spec = load_spec(config_path, ["run.iterations=7", "placement.mode=hybrid", "workers.env.args.num_envs=3"])
    assert spec.run.iterations == 7 and spec.placement.mode == "hybrid"
    assert spec.workers["env"].args["num_envs"] == 3


def test_overrides_reach_list_items_by_index_and_name_a_bad_index():
    raw = {"flow": {"sync": [{"edge": "a.w -> b.l"}, {"edge": "a.w -> c.e", "every": 25}]}}
    assert apply_overrides(raw, ["flow.sync.1.every=1"], "wf.yaml")["flow"]["sync"][1]["every"] == 1
    with pytest.raises(SpecError, match="'flow.sync.5' is not a mapping or a list index in range"):
        apply_overrides(raw, ["flow.sync.5.every=1"], "wf.yaml")
    with pytest.raises(SpecError, match="'x' is not an index of the list"):
        apply_overrides(raw, ["flow.sync.x=1"], "wf.yaml")


def test_tilde_removes_a_key_and_names_a_missing_one():
    raw = {"run": {"iterations": 3, "seed": 1}}
    assert apply_overrides(raw, ["~run.seed"], "wf.yaml") == {"run": {"iterations": 3}}
    with pytest.raises(SpecError, match="there is no key 'run.nope' to remove"):
        apply_overrides(raw, ["~run.nope"], "wf.yaml")


def test_override_without_equals_names_the_item():
    with pytest.raises(SpecError, match="override 'run.iterations': expected key=value"):
        apply_overrides({}, ["run.iterations"], "wf.yaml")


def test_unknown_key_suggests_the_right_one(config_path):
    with pytest.raises(SpecError) as info:
        load_spec(config_path, ["workers.env.replica=3"])
    message = str(info.value)
    assert "workers.env.replica: unknown key; did you mean 'replicas'?" in message
    assert str(config_path) in message


def test_unknown_worker_in_an_edge_names_the_edge(config_path):
    raw = _raw(config_path)
    raw["flow"]["then"] = ["env.trajectory -> learner.train"]
    assert "flow.then[0] 'env.trajectory -> learner.train' (destination): unknown worker 'learner'" in _problems(raw)


def test_unknown_port_lists_the_ports_there_are(config_path):
    raw = _raw(config_path)
    raw["flow"]["loop"]["edges"][1] = "rollout.act -> env.stepp"
    message = _problems(raw)
    assert "flow.loop.edges[1]" in message and "has no port 'stepp'" in message and "step" in message


def test_wrong_type_names_the_key_and_the_value(config_path):
    raw = _raw(config_path)
    raw["workers"]["env"]["replicas"] = "two"
    with pytest.raises(SpecError, match=r"workers\.env\.replicas: .*got 'two'"):
        spec_from_dict(raw, "wf.yaml")


def test_missing_field_is_named(config_path):
    raw = _raw(config_path)
    del raw["workers"]["rollout"]["class"]
    with pytest.raises(SpecError, match=r"workers\.rollout\.class: required key is missing"):
        spec_from_dict(raw, "wf.yaml")


def test_cycle_outside_the_loop_is_refused(config_path):
    raw = _raw(config_path)
    raw["flow"]["then"] = ["env.trajectory -> actor.train", "actor.train -> env.trajectory"]
    assert "flow.then: cycle" in _problems(raw)


def test_loop_edges_must_chain(config_path):
    raw = _raw(config_path)
    raw["flow"]["loop"]["edges"] = ["env.obs -> rollout.act", "env.obs -> env.step"]
    assert "must start where the previous edge ends ('rollout.act')" in _problems(raw)


def test_bad_class_path_says_what_was_tried(config_path):
    raw = _raw(config_path)
    raw["workers"]["env"]["class"] = "m2flow.workers.env.NoSuchEnv"
    assert "workers.env.class: module 'm2flow.workers.env' has no attribute 'NoSuchEnv'" in _problems(raw)


def test_backend_only_on_training_workers(config_path):
    raw = _raw(config_path)
    raw["workers"]["rollout"]["backend"] = "fsdp"
    with pytest.raises(SpecError, match="workers.rollout: 'backend' applies to training workers only"):
        spec_from_dict(raw)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "the file is empty"),
        ("- a\n- b\n", "the top level must be a mapping"),
        ("name: [unclosed\n", "not valid YAML at line"),
        ("!!python/object/apply:os.system ['true']", "not valid YAML"),
    ],
)
def test_unreadable_files_give_clear_errors(tmp_path, text, expected):
    path = tmp_path / "wf.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match=expected):
        load_spec(path)


def test_loop_replicas_beyond_the_batch_source_are_refused(config_path):
    raw = _raw(config_path)
    raw["workers"]["rollout"]["replicas"] = 3
    assert (
        "workers.rollout.replicas: 3 replicas, but the loop's batch comes from the 2 replica(s) of 'env'"
        in _problems(raw)
    )


def test_a_file_that_extends_another_merges_its_keys_over_that_file_s(tmp_path):
    spec = load_spec(ROOT / "configs" / "ppo_async_mujoco.yaml")
    base = load_spec(ROOT / "configs" / "ppo_mujoco.yaml")
    assert spec.name == "ppo-async-mujoco" and spec.flow.asynchronous.max_staleness == 1
    assert spec.workers["actor"].args["off_policy"] == "decoupled"
    assert spec.workers["actor"].args["update_epochs"] == base.workers["actor"].args["update_epochs"]  # kept
    assert spec.flow.sync == base.flow.sync and spec.workers["env"] == base.workers["env"]
    (tmp_path / "a.yaml").write_text("extends: b.yaml\nname: a\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(SpecError, match=r"extends: the files extend each other in a cycle: .*a.yaml -> .*b.yaml"):
        load_spec(tmp_path / "a.yaml")
    (tmp_path / "c.yaml").write_text("extends: missing.yaml\n")
    with pytest.raises(SpecError, match=r"file not found: .*missing.yaml \(extended by .*c.yaml\)"):
        load_spec(tmp_path / "c.yaml")
