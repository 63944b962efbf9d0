"""Mistakes a user makes, each found by an audit of `m2flow validate`/`plan` and the Python API: every one ends in
an error that names the key (or argument) and what to do — no traceback, nothing silently accepted (the command
line's own: `test_cli_mistakes.py`)."""

from __future__ import annotations

import copy
import sys
import textwrap

import pytest
from numpy.random import Generator

import m2flow as mf
from m2flow.config import load_spec, parse_yaml, spec_from_dict
from m2flow.errors import SpecError
from m2flow.graph import build_graph
from m2flow.resolve import resolve
from tests.conftest import ROOT

BASE = {
    "name": "mistakes",
    "workers": {
        "env": {"kind": "simulator", "class": "tests.workers_for_tests.Counter", "args": {"num_envs": 2}},
        "policy": {"kind": "inference", "class": "tests.workers_for_tests.PlusOne"},
        "learner": {"kind": "training", "class": "tests.workers_for_tests.Collect"},
    },
    "flow": {
        "loop": {"horizon": 4, "edges": ["env.obs -> policy.act", "policy.act -> env.step"]},
        "then": ["env.trajectory -> learner.train"],
    },
    "cluster": {"cpus": 2, "gpus": 0},
}


def problems_of(raw: dict) -> list[str]:
    with pytest.raises(SpecError) as caught:
        build_graph(spec_from_dict(raw))
    return caught.value.problems


def test_metrics_a_worker_returns_as_numpy_numbers_are_averaged_like_python_ones():
    import numpy as np

    from m2flow.runtime.iteration_metrics import mean_of_dicts

    replicas = [
        {"loss": np.float32(1.5), "steps": np.int64(4), "kl": np.array([0.25]), "ok": True, "tag": "x", "v": [1, 2]},
        {"loss": 0.5, "steps": 2, "kl": 0.75},
    ]
    assert mean_of_dicts(replicas) == {"loss": 1.0, "steps": 3.0, "kl": 0.5}  # no flag, text or list is a metric


def test_a_worker_module_that_fails_as_it_is_imported_is_named_with_its_file_and_line(tmp_path, monkeypatch):
    (tmp_path / "broken_syntax_env.py").write_text("import os\n\ndef step(:\n    pass\n")
    (tmp_path / "raising_env.py").write_text("import os\n\nraise RuntimeError('no simulator licence')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "calling_env.py").write_text("import json\n\nSETTINGS = json.loads('{')\n")  # raised inside json
    failures = (
        ("broken_syntax_env", "SyntaxError"),
        ("raising_env", "RuntimeError: no simulator licence"),
        ("calling_env", "JSONDecodeError"),
    )
    for module, said in failures:
        with pytest.raises(SpecError) as caught:
            resolve(f"{module}.Env", "workers.env.class")
        (problem,) = caught.value.problems
        assert problem.startswith(f"workers.env.class: importing module '{module}' failed: {said}")
        assert f"{module}.py, line 3" in problem


def test_a_module_left_in_the_working_directory_is_said_to_need_pythonpath(tmp_path, monkeypatch):
    (tmp_path / "only_here_env.py").write_text("class Env:\n    pass\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    with pytest.raises(SpecError) as caught:
        resolve("only_here_env.Env", "workers.env.class")
    assert "'only_here_env' is in the working directory" in caught.value.problems[0]
    assert "PYTHONPATH=." in caught.value.problems[0]


def test_a_key_given_twice_in_yaml_is_refused_with_both_lines_and_a_merged_key_may_be_overridden():
    with pytest.raises(SpecError) as caught:
        parse_yaml("name: a\nworkers:\n  env:\n    replicas: 2\n    replicas: 8\n", "wf.yaml")
    assert "line 5" in caught.value.problems[0] and "'replicas' is given twice (first at line 4)" in str(caught.value)
    merged = textwrap.dedent(
        """
        policy: &policy {hidden: [64, 64], lr: 1}
        actor:
          <<: *policy
          lr: 2
        """
    )
    assert parse_yaml(merged, "wf.yaml")["actor"] == {"hidden": [64, 64], "lr": 2}
    # a merge inside an anchored mapping that a mapping read before it pastes: its own key still overrides once
    chained = textwrap.dedent(
        """
        evaluation:
          policy: &policy
            <<: &common {hidden: [64, 64], lr: 1}
            hidden: [256, 256]
        actor: {<<: *policy, epochs: 2}
        rollout: *policy
        """
    )
    assert parse_yaml(chained, "wf.yaml")["rollout"] == {"hidden": [256, 256], "lr": 1}


AGREE = "give both the same (an override changes only the key it names)"


def test_workers_joined_by_an_edge_that_disagree_on_their_env_or_model_are_refused_naming_both_keys(config_path):
    hopper = ["workers.env.args.env_id=Hopper-v5", "workers.env.args.evaluation.policy.env_id=Hopper-v5"]
    with pytest.raises(SpecError) as caught:
        build_graph(load_spec(config_path, [*hopper, "workers.rollout.args.hidden=[64, 64]"]))
    assert caught.value.problems == [
        "flow.loop.edges[0] 'env.obs -> rollout.act': workers 'env' and 'rollout' must agree on env_id: 'Hopper-v5' at"
        f" workers.env.args.env_id, 'HalfCheetah-v5' at workers.rollout.args.env_id; {AGREE}",
        "flow.sync[0].edge 'actor.weights -> rollout.load_weights': workers 'actor' and 'rollout' must agree on hidden:"
        f" [256, 256] at workers.actor.args.hidden, [64, 64] at workers.rollout.args.hidden; {AGREE}",
        "flow.sync[1].edge 'actor.weights -> env.evaluate': workers 'actor' and 'env' must agree on env_id:"
        f" 'HalfCheetah-v5' at workers.actor.args.env_id, 'Hopper-v5' at workers.env.args.evaluation.policy.env_id;"
        f" {AGREE}",
    ]


def test_weights_synced_into_evaluation_must_fit_the_evaluation_policy(config_path):
    smaller = ["workers.rollout.args.hidden=[64, 64]", "workers.actor.args.hidden=[64, 64]"]
    with pytest.raises(SpecError) as caught:
        build_graph(load_spec(config_path, smaller))
    assert caught.value.problems == [
        "flow.sync[1].edge 'actor.weights -> env.evaluate': workers 'actor' and 'env' must agree on hidden:"
        f" [64, 64] at workers.actor.args.hidden, [256, 256] at workers.env.args.evaluation.policy.hidden; {AGREE}"
    ]
    build_graph(load_spec(config_path, [*smaller, "workers.env.args.evaluation.policy.hidden=[64, 64]"]))


def test_a_vit_is_compared_as_built_its_preset_width_written_or_not_and_no_field_another_model_reads():
    vit = ["model=vit", "size=10m"]
    at = ("workers.rollout.args", "workers.actor.args", "workers.env.args.evaluation.policy")
    policies = [f"{args}.{setting}" for args in at for setting in vit]
    camera = ROOT / "configs" / "ppo_camera.yaml"
    same = [*policies, "workers.actor.args.width=384", "workers.rollout.args.hidden=[32]"]  # 384: the 10m preset's
    build_graph(load_spec(camera, same))
    with pytest.raises(SpecError) as caught:
        build_graph(load_spec(camera, [*policies, "workers.actor.args.width=512"]))
    assert caught.value.problems[0] == (
        "flow.sync[0].edge 'actor.weights -> rollout.load_weights': workers 'actor' and 'rollout' must agree on width:"
        f" 512 at workers.actor.args.width, 384 at workers.rollout.args.size; {AGREE}"
    )


def test_an_evaluation_policy_acting_in_another_env_than_its_simulator_s_is_refused(config_path):
    with pytest.raises(SpecError) as caught:
        build_graph(load_spec(config_path, ["workers.env.args.env_id=Hopper-v5"]))
    assert caught.value.problems[0].startswith(
        "workers.env.args: evaluation.policy.env_id: the evaluation policy acts in this simulator's env ('Hopper-v5'),"
        " not in 'HalfCheetah-v5'; give it the same"
    )


def test_an_override_of_a_key_an_alias_pasted_changes_that_key_only(config_path):
    spec = load_spec(config_path, ["workers.rollout.args.hidden=[64, 64]"])  # args: *policy
    assert spec.workers["rollout"].args["hidden"] == [64, 64]
    assert spec.workers["env"].args["evaluation"]["policy"]["hidden"] == [256, 256]  # the anchor: policy: &policy
    assert spec.workers["actor"].args["hidden"] == [256, 256]  # <<: *policy


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("placement.pipeline_stages=foo", "placement.pipeline_stages: should be a valid integer or 'auto'"),
        ("placement.colocate=maybe", "placement.colocate: should be a valid boolean or 'auto'"),
        ("run.seed=-5", "run.seed: Input should be greater than or equal to 0"),
        ("workers.enx.replicas=2", "workers.enx: no such worker; did you mean 'env'?"),
    ],
)
def test_a_bad_override_is_one_problem_that_names_its_key(config_path, override, said):
    with pytest.raises(SpecError) as caught:
        load_spec(config_path, [override])
    assert len(caught.value.problems) == 1, caught.value.problems  # one line, not one per member of a union
    assert caught.value.problems[0].startswith(said), caught.value.problems


def test_a_new_worker_given_its_class_by_override_is_not_taken_for_a_misspelling(config_path):
    spec = load_spec(
        config_path, ["workers.actor2.class=tests.workers_for_tests.Collect", "workers.actor2.kind=training"]
    )
    assert spec.workers["actor2"].cls == "tests.workers_for_tests.Collect"


def test_a_cost_declared_for_a_port_the_worker_lacks_is_refused_with_the_closest_port():
    raw = copy.deepcopy(BASE)
    raw["workers"]["env"]["profile"] = {"stepp": {"fixed_s": 0.01}}
    (problem,) = problems_of(raw)
    assert problem.startswith("workers.env.profile.stepp: 'env' has no port 'stepp'; did you mean 'step'?")


@pytest.mark.parametrize(
    ("flow", "override"),
    [
        ("then", "flow.then=[env.trajectory -> actor.train, env.trajectory -> actor.train]"),
        ("sync", "flow.sync.1.edge=actor.weights -> rollout.load_weights"),
    ],
)
def test_an_edge_given_twice_is_refused(config_path, flow, override):
    with pytest.raises(SpecError) as caught:
        build_graph(load_spec(config_path, [override]))
    (problem,) = caught.value.problems
    assert problem.startswith(f"flow.{flow}[1] ") and f"the same edge as flow.{flow}[0]; give each edge once" in problem


def test_a_data_parallel_declaration_that_raises_is_named_not_a_traceback():
    raw = copy.deepcopy(BASE)
    raw["workers"]["learner"]["class"] = "tests.unit.test_user_mistakes.SizerThatRaises"
    (problem,) = problems_of(raw)
    assert problem == (
        "workers.learner: tests.unit.test_user_mistakes.SizerThatRaises.data_parallel_size failed:"
        " TypeError: unsupported operand"
    )


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (
            ["workers.actor.replicas=2"],
            "workers.actor.replicas: SAC trains on one rank, not 2; set it to 1",
        ),
        (
            ["workers.buffer.replicas=3", "workers.env.replicas=3"],
            "workers.buffer.args.batch_size: 256 does not split evenly over 3 buffer shards",
        ),
        (
            ["workers.buffer.replicas=2", "workers.env.replicas=3"],
            "flow.then[0] 'env.trajectory -> buffer.add': buffer needs as many input shards on each of its 2 ranks,"
            " but env.trajectory gives 3 (one per replica of env); give workers.env.replicas a multiple of"
            " workers.buffer.replicas (2)",
        ),
    ],
)
def test_replica_counts_sac_and_its_buffer_cannot_run_are_refused_as_the_workflow_is_validated(overrides, said):
    with pytest.raises(SpecError) as caught:
        build_graph(load_spec(ROOT / "configs" / "sac_mujoco.yaml", overrides))
    assert caught.value.problems[0].startswith(said), caught.value.problems


def test_the_planner_gives_a_sharded_buffer_only_simulator_counts_that_fill_its_shards_evenly():
    overrides = ["workers.buffer.replicas=2", "workers.env.args.num_envs=6", "workers.env.replicas={min: 1, max: 3}"]
    plan = mf.plan(load_spec(ROOT / "configs" / "sac_mujoco.yaml", [*overrides, "cluster.cpus=4"]))
    assert plan.notes[0].startswith("allocation: env 2 x 3")
    uneven = next(row for row in plan.candidates if row.layout == "env 3 x 2")
    assert not uneven.feasible and "buffer needs as many input shards on each of its 2 ranks" in uneven.reason


def test_an_even_split_is_refused_for_a_port_that_does_not_shard():
    with pytest.raises(ValueError, match="even: only a `shard` split"):
        mf.Dispatch(split="broadcast", even=True)


def test_a_camera_the_task_s_model_lacks_is_refused_as_the_workflow_is_validated(config_path):
    views = [f"workers.{w}.args.observation.cameras=[trak]" for w in ("env", "rollout", "actor")]
    with pytest.raises(SpecError) as caught:
        build_graph(load_spec(ROOT / "configs" / "ppo_camera.yaml", views))
    assert (
        "observation.cameras: HalfCheetah-v5 has no camera 'trak' (its cameras: track); did you mean 'track'?"
        in (caught.value.problems[0])
    )
    filmed = ["workers.env.args.video.save=true", "workers.env.args.video.camera=corner"]
    with pytest.raises(SpecError, match="video.camera: HalfCheetah-v5 has no camera 'corner' \\(its cameras: track\\)"):
        build_graph(load_spec(ROOT / "configs" / "ppo_camera.yaml", filmed))


def test_a_boolean_written_for_a_number_is_refused_at_every_depth(config_path):
    with pytest.raises(SpecError, match="cluster.cpus: expected a number, not the boolean true"):
        load_spec(ROOT / "configs" / "ppo_camera.yaml", ["cluster.cpus=true"])
    overrides = [
        "workers.env.args.num_envs=false",
        "workers.env.args.video.fps=true",
        "workers.actor.args.hidden=[true]",
    ]
    with pytest.raises(SpecError) as caught:
        build_graph(load_spec(ROOT / "configs" / "ppo_camera.yaml", overrides))
    said = " ".join(caught.value.problems)
    for key, value in (("workers.env.args.num_envs", "false"), ("workers.env.args.video.fps", "true")):
        assert f"{key}: expected a number, not the boolean {value}" in said, said
    assert "workers.actor.args.hidden: item 0: expected a number, not the boolean true" in said, said


def test_a_field_that_takes_a_boolean_or_no_number_keeps_it():
    from typing import Any, Literal

    from m2flow.strict_numbers import takes

    assert takes(int | bool, bool) and takes(Literal[True, "auto"], bool) and takes(Any, bool)
    assert not takes(int | Literal["auto"], bool) and takes(int | Literal["auto"], int)
    assert not takes(str, int) and not takes(list[int], int)  # only the field's own type: not its items


class SizerThatRaises:
    @staticmethod
    def data_parallel_size(config, replicas, backend):
        raise TypeError("unsupported operand")

    def train(self, trajectories: list[dict]) -> dict:
        return {}


class PlainLearner:
    """A class without a Config: its constructor's annotations type its arguments."""

    def __init__(
        self,
        lr: float = 1e-3,
        layers: list[int] | None = None,
        ratio: float = 0.5,
        rng: Generator = None,
        seed: int = None,
    ):
        self.lr, self.layers, self.ratio, self.rng, self.seed = lr, layers, ratio, rng, seed

    def train(self, trajectories: list[dict]) -> dict:
        return {}


def test_the_arguments_of_a_class_without_a_config_are_checked_against_its_annotations():
    raw = copy.deepcopy(BASE)
    raw["workers"]["learner"]["class"] = "tests.unit.test_user_mistakes.PlainLearner"
    raw["workers"]["learner"]["args"] = {"lr": "fast", "layers": [64, "wide"], "ratio": True, "rng": 7}
    assert problems_of(raw) == [
        "workers.learner.args.lr: Input should be a valid number, unable to parse string as a number (PlainLearner"
        " takes lr: float; got 'fast')",
        "workers.learner.args.layers: Input should be a valid integer, unable to parse string as an integer"
        " (PlainLearner takes layers: list[int] | None; got [64, 'wide'])",
        "workers.learner.args.ratio: expected a number, not the boolean true (PlainLearner takes ratio: float; got"
        " True)",
    ]  # rng: a type pydantic cannot check goes unchecked
    raw["workers"]["learner"]["args"] = {"lr": 3, "layers": [64, 64], "ratio": 0.25, "seed": None}  # its own default
    build_graph(spec_from_dict(raw))


def test_define_worker_takes_a_dotted_path_and_refuses_what_cannot_be_imported_by_name():
    env = mf.define_worker("env", "tests.workers_for_tests.Counter", kind="simulator", args={"num_envs": 2})
    policy = mf.define_worker("policy", "tests.workers_for_tests.PlusOne", kind="inference")
    workflow = mf.Workflow("by-path", [env, policy]).cluster(cpus=2, gpus=0)
    workflow.loop(env.port("obs") >> policy.port("act"), policy.port("act") >> env.port("step"), horizon=2)
    assert set(mf.plan(workflow).placements) == {"env", "policy"}
    with pytest.raises(SpecError, match=r"define_worker\('x'\): 5 \(of type int\) is not a class or function"):
        mf.define_worker("x", 5)
    with pytest.raises(SpecError, match="define it at a module's top level"):
        mf.define_worker("x", func=lambda obs: obs)


def test_a_workflow_of_something_else_than_workers_or_of_one_name_twice_is_refused():
    env = mf.define_worker("env", "tests.workers_for_tests.Counter", kind="simulator")
    with pytest.raises(SpecError, match=r"Workflow\('w'\): 'env' is not a worker; list what define_worker"):
        mf.Workflow("w", ["env"])
    with pytest.raises(SpecError, match=r"Workflow\('w'\): worker name\(s\) env given twice"):
        mf.Workflow("w", [env, env])
    with pytest.raises(SpecError, match="42 is not a workflow"):
        mf.plan(42)


@pytest.mark.parametrize("kind", ["training", "function"])
def test_a_simulator_class_declared_as_another_kind_is_refused_naming_the_kind_to_set(config_path, kind):
    with pytest.raises(SpecError) as caught:
        build_graph(load_spec(config_path, [f"workers.env.kind={kind}"]))
    assert caught.value.problems == [
        f"workers.env.kind: m2flow.workers.env.GymEnv serves envs (its Config's items_field: num_envs), which a"
        f" simulator worker does and a '{kind}' worker does not; set workers.env.kind: simulator"
    ]


@pytest.mark.parametrize("fixed", ["workers.rollout.replicas=2", "workers.actor.replicas=2"])
def test_a_count_the_planner_may_still_choose_is_planned_not_refused_as_too_few(config_path, fixed):
    spec = load_spec(config_path, ["workers.env.replicas=auto", fixed, "cluster.cpus=4", "cluster.gpus=0"])
    plan = mf.plan(spec)
    assert len(plan.placements["env"].replica_devices) >= 2  # a shard for each of the two replicas


def test_a_count_beyond_what_the_planner_may_choose_is_refused_saying_at_most(config_path):
    spec = load_spec(config_path, ["workers.env.replicas={min: 1, max: 1}", "workers.rollout.replicas=2"])
    with pytest.raises(SpecError, match=r"comes from 'env', which the planner gives at most 1 replica\(s\) \(its"):
        build_graph(spec)
    one_env = ["workers.env.replicas=auto", "workers.env.args.num_envs=1", "workers.rollout.replicas=2"]
    with pytest.raises(SpecError, match=r"at most 1 replica\(s\) \(one per env of its 1\)"):
        build_graph(load_spec(config_path, one_env))


def test_every_unknown_argument_of_a_class_without_a_config_is_named_and_none_taken_is_said():
    raw = copy.deepcopy(BASE)
    raw["workers"]["policy"]["args"] = {"temperatur": 1.0, "seed": 3}  # PlusOne() takes no arguments
    assert problems_of(raw) == [
        "workers.policy.args.temperatur: unknown argument of PlusOne; it takes: no arguments",
        "workers.policy.args.seed: unknown argument of PlusOne; it takes: no arguments",
    ]


def test_timeouts_whose_floor_is_above_their_ceiling_are_refused(config_path):
    with pytest.raises(SpecError, match=r"run.timeouts: floor_s \(100\) is above ceiling_s \(10\)"):
        load_spec(config_path, ["run.timeouts.floor_s=100", "run.timeouts.ceiling_s=10"])


def test_auto_says_each_reason_no_placement_fits_once(config_path):
    with pytest.raises(mf.PlanError) as caught:
        mf.plan(load_spec(config_path, ["placement.pipeline_stages=8", "cluster.cpus=2", "cluster.gpus=0"]))
    reasons = str(caught.value).splitlines()[1:]
    assert len(reasons) == len(set(reasons)) == 2, reasons  # disaggregated's, and the stages' shared by the others


def test_define_worker_takes_the_dispatch_a_yaml_worker_may_declare():
    env = mf.define_worker("env", "tests.workers_for_tests.Counter", kind="simulator")
    learner = mf.define_worker(
        "learner", "tests.workers_for_tests.Collect", kind="training", dispatch={"train": {"split": "broadcast"}}
    )
    spec = mf.Workflow("dispatched", [env, learner]).then(env.port("trajectory") >> learner.port("train")).spec()
    assert spec.workers["learner"].dispatch["train"].split == "broadcast"


def test_a_hand_layout_written_wrong_is_refused_as_the_workflow_is_validated(config_path):
    with pytest.raises(SpecError) as caught:
        load_spec(config_path, ["placement.devices={env: 3-1, rollout: first}"])
    (problem,) = caught.value.problems
    assert problem.startswith(
        "placement.devices: env: the range '3-1' runs backwards; write 1-3; rollout: 'first' is not a device list"
    )
    with pytest.raises(SpecError, match=r"placement.devices.envv: no worker named 'envv'; did you mean 'env'\?"):
        build_graph(load_spec(config_path, ["placement.devices={envv: 0-1}"]))


def test_policies_chained_in_a_loop_may_differ_in_architecture_where_no_weights_move_between_them(config_path):
    high = {"class": "m2flow.workers.rollout.TorchPolicy", "kind": "inference"}
    overrides = [f"workers.high.{key}={value}" for key, value in high.items()]
    overrides += ["workers.high.args={env_id: HalfCheetah-v5, hidden: [32, 32]}"]
    overrides += ["flow.loop.edges=[env.obs -> high.act, high.act -> rollout.act, rollout.act -> env.step]"]
    graph = build_graph(load_spec(config_path, overrides))
    assert graph.loop.workers == ["env", "high", "rollout"]
