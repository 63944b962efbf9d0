"""A worker's args are checked against its declared config when the workflow is validated: unknown keys
with a "did you mean", wrong types and values, env ids gymnasium does not know — each named by its key,
before any cluster starts, from `validate` and from `plan`, without a traceback."""

from __future__ import annotations

import copy
import importlib

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from m2flow.cluster import Cluster
from m2flow.config import spec_from_dict
from m2flow.errors import M2FlowError, PlanError, SpecError
from m2flow.graph import build_graph
from m2flow.planners import make_plan
from tests.conftest import ROOT
from tests.unit.test_cli import m2flow

MAIN = yaml.safe_load((ROOT / "configs" / "ppo_mujoco.yaml").read_text())
MAIN["cluster"] = {"cpus": 2, "gpus": 0}


def problems_of(raw: dict) -> str:
    with pytest.raises(SpecError) as info:
        build_graph(spec_from_dict(raw, "wf.yaml"))
    return str(info.value)


def with_args(worker: str, **args) -> dict:
    raw = copy.deepcopy(MAIN)
    raw["workers"][worker]["args"].update(args)
    return raw


def test_an_unknown_arg_is_named_with_the_closest_known_one():
    message = problems_of(with_args("actor", num_minibatchez=8))
    assert "workers.actor.args.num_minibatchez: unknown key; did you mean 'num_minibatches'?" in message


def test_a_wrong_type_names_the_key_and_the_value():
    message = problems_of(with_args("env", num_envs="eight"))
    assert "workers.env.args.num_envs: Input should be a valid integer" in message and "'eight'" in message


def test_an_image_size_without_pixels_is_named_by_its_key():
    raw = yaml.safe_load((ROOT / "configs" / "ppo_camera.yaml").read_text())
    raw["workers"]["env"]["args"]["observation"] = {**raw["workers"]["env"]["args"]["observation"], "size": [0, 84]}
    assert "workers.env.args.observation.size.0: Input should be greater than or equal to 1" in problems_of(raw)


def test_an_env_id_gymnasium_does_not_know_is_refused_before_anything_starts():
    message = problems_of(with_args("env", env_id="NoSuchEnv-v0"))
    assert "workers.env.args.env_id: gymnasium has no environment 'NoSuchEnv-v0'" in message


def test_every_problem_of_every_worker_is_reported_at_once():
    raw = with_args("env", num_envs=0)
    raw["workers"]["actor"]["args"]["gamma"] = 2
    message = problems_of(raw)
    assert "workers.env.args.num_envs" in message and "workers.actor.args.gamma" in message


def test_a_function_worker_takes_no_args():
    raw = {
        "name": "f",
        "workers": {"sim": {"class": "examples.seed_chain.run_physics_sim", "args": {"speed": 2}}},
    }
    assert "workers.sim.args: a function worker takes no args (got speed)" in problems_of(raw)


def test_a_class_without_a_config_is_checked_against_its_constructor():
    raw = {
        "name": "f",
        "workers": {"data": {"class": "tests.workers_for_tests.FixedBatch", "args": {"step": 4}}},
    }
    assert "workers.data.args.step: unknown argument of FixedBatch; did you mean 'steps'?" in problems_of(raw)


def test_dispatch_rules_name_real_ports():
    raw = copy.deepcopy(MAIN)
    raw["workers"]["actor"]["dispatch"] = {"trian": {"split": "broadcast"}}
    assert "workers.actor.dispatch.trian: 'actor' has no port 'trian'" in problems_of(raw)


def test_a_data_parallel_group_needs_a_shard_per_rank():
    raw = copy.deepcopy(MAIN)
    raw["workers"]["env"]["replicas"] = 1
    raw["workers"]["actor"]["replicas"] = 2
    message = problems_of(raw)
    assert "actor splits its input over 2 data-parallel ranks but env.trajectory gives 1 shard(s)" in message
    assert "raise workers.env.replicas to 2 or lower workers.actor.replicas" in message


def test_tensor_parallel_ranks_share_one_shard():
    raw = copy.deepcopy(MAIN)
    raw["workers"]["env"]["replicas"] = 1
    raw["workers"]["actor"].update(replicas=2, backend="megatron")
    graph = build_graph(spec_from_dict(raw))
    assert graph.info["actor"].data_parallel == 1


def test_an_unknown_training_backend_names_the_key():
    raw = copy.deepcopy(MAIN)
    raw["workers"]["actor"]["backend"] = "deepspeed"
    assert "workers.actor.backend: unknown backend 'deepspeed' (known: fsdp, megatron)" in problems_of(raw)


def test_an_estimator_that_fails_is_a_plan_error_naming_the_worker():
    raw = with_args("rollout", env_kwargs={"no_such_kwarg": 1})
    spec = spec_from_dict(raw)
    with pytest.raises(PlanError, match=r"workers\.rollout: m2flow\.workers\.rollout\.TorchPolicy\.memory_estimate_gb"):
        make_plan(build_graph(spec), Cluster.from_spec(spec.cluster))


@pytest.mark.parametrize("command", ["validate", "plan"])
def test_the_cli_prints_a_bad_arg_without_a_traceback(command, tmp_path):
    out = (
        m2flow(
            command,
            str(ROOT / "configs" / "ppo_mujoco.yaml"),
            "workers.actor.args.num_minibatchez=8",
            "--out",
            str(tmp_path),
        )
        if command == "plan"
        else m2flow(command, str(ROOT / "configs" / "ppo_mujoco.yaml"), "workers.env.args.num_envs=eight")
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "workers.actor.args.num_minibatchez" in out.stderr or "workers.env.args.num_envs" in out.stderr


ARG_PATHS = [
    ("env", "env_id"),
    ("env", "num_envs"),
    ("env", "clip_actions"),
    ("env", "env_kwargs"),
    ("rollout", "model"),
    ("rollout", "hidden"),
    ("rollout", "activation"),
    ("rollout", "chunk"),
    ("rollout", "deterministic"),
    ("actor", "learning_rate"),
    ("actor", "num_minibatches"),
    ("actor", "gamma"),
    ("actor", "precision"),
    ("actor", "advantage"),
    ("actor", "size"),
]
junk = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats() | st.text(max_size=12)
junk = junk | st.lists(junk, max_size=3) | st.dictionaries(st.text(max_size=8), junk, max_size=2)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(where=st.sampled_from(ARG_PATHS), value=junk)
def test_any_value_of_a_built_in_workers_arg_plans_or_names_the_worker(where, value):
    worker, key = where
    raw = with_args(worker, **{key: value})
    try:
        spec = spec_from_dict(raw, "wf.yaml")
        make_plan(build_graph(spec), Cluster.from_spec(spec.cluster))
    except SpecError as exc:  # a bad value: its key named
        assert f"workers.{worker}.args.{key}" in str(exc) or f"workers.{worker}.args:" in str(exc), str(exc)
    except M2FlowError as exc:  # a value the config accepts but the model cannot be built with: its worker named
        assert f"workers.{worker}" in str(exc), str(exc)


BUILT_IN_WORKERS = [
    "m2flow.workers.env.GymEnv",
    "m2flow.workers.env.CameraEnv",
    "m2flow.workers.env.behavior.BehaviorEnv",
    "m2flow.workers.rollout.TorchPolicy",
    "m2flow.workers.actor.PPO",
    "m2flow.workers.actor.SAC",
    "m2flow.workers.buffer.replay.ReplayBuffer",
    "m2flow.workers.synthetic.SpinSimulator",
]


@pytest.mark.parametrize("path", BUILT_IN_WORKERS)
def test_every_argument_of_a_built_in_worker_is_documented(path):
    module, _, name = path.rpartition(".")
    config = getattr(importlib.import_module(module), name).Config
    assert [field for field, info in config.model_fields.items() if not info.description] == []
