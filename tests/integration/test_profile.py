"""`m2flow profile` measures the real workers; the plan then predicts from what it measured."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from m2flow.cluster import Cluster
from m2flow.config import load_spec, spec_from_dict
from m2flow.errors import WorkerError
from m2flow.graph import build_graph
from m2flow.planners import Profile, make_plan
from m2flow.planners.trace_calls import started_at
from m2flow.runtime.profiling import measure_profile
from m2flow.schedule import Plan
from tests.conftest import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_cluster")]


def test_profiling_fits_every_port_at_three_batch_sizes_and_feeds_the_planner(tmp_path):
    """How close the fit comes to the spin workers' true costs is a timing claim: benchmarks/planner.py
    measures it. Here: what is measured, that costs grow with the envs stepped, and that plans use it."""
    spec = load_spec(ROOT / "configs" / "spin_balanced.yaml", [f"run.output_dir={tmp_path}", "flow.loop.horizon=24"])
    measured = measured_profile = measure_profile(spec)
    ports = measured_profile["ports"]
    assert ports["env.step"].batch_sizes == (2, 4, 8)
    assert {"env.obs", "env.step", "env.trajectory", "policy.act", "trainer.train"} <= set(ports)
    assert all(fit.calls > 0 for fit in ports.values())
    assert ports["env.step"].per_item_s > 0 and ports["policy.act"].per_item_s > 0  # they spin per env
    assert measured_profile["hop_s"] + 2 * measured_profile["hop_item_s"] > 0  # a message of the fewest envs costs

    graph = build_graph(spec)
    profile = Profile.from_graph(graph, measured)
    assert profile.source["env.step"] == "measured"
    plan = make_plan(graph, Cluster.from_spec(spec.cluster.model_copy(update={"cpus": 2, "gpus": 0})), profile)
    assert plan.mode == "hybrid" and plan.pipeline_stages >= 2


def test_online_replan_moves_to_the_plan_the_measured_costs_favour_and_the_trace_marks_both_starts(tmp_path):
    # the declared costs say the loop is free, so the first plan is the plain shared one; the real
    # (spinning) costs are balanced, which favours pipelining env and policy on separate cores
    spec = load_spec(
        ROOT / "configs" / "spin_balanced.yaml",
        [
            f"run.output_dir={tmp_path}",
            "run.iterations=4",
            "flow.loop.horizon=32",
            "placement.replan=true",
            "run.progress=false",
            "workers.env.profile={step: {per_item_s: 1.0e-7}}",
            "workers.policy.profile={act: {fixed_s: 1.0e-7}}",
        ],
    )
    import m2flow as mf

    result = mf.run(spec)
    initial = (result.run_dir / "plan.initial.json").read_text()
    assert '"pipeline_stages": 1' in initial
    assert result.plan.mode == "hybrid" and result.plan.pipeline_stages >= 2
    assert "replan: switching" in result.plan.notes[-1]
    assert [h["iteration"] for h in result.history] == [0, 1, 2, 3]
    assert result.last["trainer/steps"] == 32 * 8
    events = json.loads((result.run_dir / "trace.json").read_text())["traceEvents"]
    (first, before), (switched, now) = started_at(events)  # the trace marks where the workers started, by plan
    assert (first, before) == (0, Plan.load(result.run_dir / "plan.initial.json").label)
    assert 0 < switched < 4 and now == result.plan.label


def test_the_simulator_layout_auto_chooses_is_the_one_that_runs(tmp_path):
    import m2flow as mf

    spec = load_spec(
        ROOT / "configs" / "spin_balanced.yaml",
        [
            f"run.output_dir={tmp_path}",
            "run.iterations=2",
            "flow.loop.horizon=8",
            "run.progress=false",
            "placement.search_processes=true",
            "placement.pipeline_stages=1",
            "workers.policy.profile={act: {fixed_s: 1.0e-5}}",
            "workers.env.profile={step: {per_item_s: 5.0e-4}}",
        ],
    )
    result = mf.run(spec)
    assert result.plan.spec_overrides == ["workers.env.replicas=2", "workers.env.args.num_envs=4"]
    assert {"env[0]", "env[1]"} <= set(result.nodes)
    assert result.last["env_steps"] == 2 * 8 * 8  # the same 8 envs, in two processes of 4


def test_calibration_corrects_costs_declared_5x_wrong_and_the_next_run_starts_from_the_cache(tmp_path):
    """The spin workers' true costs: env 0.5 ms per env, policy 0.4 ms + 0.45 ms per env. Declared 5x too
    high and 5x too low, the run measures them, re-plans and caches them; a second run (and `plan`) starts
    from the cache and does not need to calibrate."""
    import math

    import m2flow as mf
    from m2flow.planners import profile_of

    def spec(**run):
        return load_spec(
            ROOT / "configs" / "spin_balanced.yaml",
            [
                f"run.output_dir={tmp_path}",
                "run.iterations=4",
                "flow.loop.horizon=32",
                "run.progress=false",
                "workers.env.profile={step: {per_item_s: 2.5e-3}}",  # 5x the truth
                "workers.policy.profile={act: {fixed_s: 0.8e-4, per_item_s: 0.9e-4}}",  # a fifth of it
                *[f"run.{k}={v}" for k, v in run.items()],
            ],
        )

    first = mf.run(spec())
    assert "replan:" in first.plan.notes[-1]
    graph = build_graph(spec())
    cluster = Cluster.from_spec(spec().cluster.model_copy(update={"cpus": 2, "gpus": 0}))
    cached = {k: v for k, v in profile_of(graph, cluster).source.items() if v == "cached"}
    assert {"env.obs", "env.trajectory", "trainer.train"} <= set(cached)  # what nobody declared
    measured = first.plan.predicted  # the plan's prediction now comes from what the run measured
    assert measured.cost_sources["env.step"].startswith("measured")
    step = first.plan.predicted.port_s["env.step"] / (32 * 1)  # one call per step, 8 envs
    truth, declared = 0.5e-3 * 8, 2.5e-3 * 8
    assert abs(math.log(step / truth)) < abs(math.log(declared / truth)) / 2
    raw = spec().to_dict()
    for worker in ("env", "policy"):
        raw["workers"][worker].pop("profile")
    second = mf.run(spec_from_dict({**raw, "name": "spin-again"}))
    assert second.plan.predicted.unknown_costs == []  # every cost came from the cache: no calibration
    assert not any(note.startswith("replan:") for note in second.plan.notes)


def test_a_run_tries_other_batch_sizes_when_a_cost_split_it_could_not_measure_decides_the_plan(tmp_path, capsys):
    """The simulator's step costs 4 ms a call whatever its envs (as a GPU renders a slice), the policy little
    beside it: at one slice size the step reads as per env, and the run's first plan pipelines. The run tries
    one stage, measures both sizes, keeps a one-stage plan, and caches both sizes."""
    import m2flow as mf
    from m2flow.planners import device_kinds
    from m2flow.planners.cache import cached_fits

    spec = load_spec(
        ROOT / "configs" / "spin_balanced.yaml",
        [
            f"run.output_dir={tmp_path}",
            "run.iterations=9",
            "flow.loop.horizon=16",
            "run.progress=false",
            "workers.env.args={num_envs: 8, fixed_s: 0.004, per_env_s: 0.0}",
            "workers.policy.args={fixed_s: 0.0004, per_env_s: 0.0001}",  # cheap beside the step: S=1 pays
        ],
    )
    result = mf.run(spec)
    said = " ".join(capsys.readouterr().err.split())  # the console wraps lines
    initial = (result.run_dir / "plan.initial.json").read_text()
    assert '"pipeline_stages": 2' in initial  # the defaults' split (per env) pipelines
    replans = re.findall(r"replan: .*?(?= m2flow:|$)", said)
    tried = re.search(r"replan: trying (\w+) S=1( co-hosted)? for 3 iterations: env\.step", said)
    assert tried and "were their cost per call" in said, replans  # one stage, whichever placement
    assert result.plan.pipeline_stages == 1 and "replan: " in result.plan.notes[-1]
    assert [h["iteration"] for h in result.history] == list(range(9))
    assert result.last["env_steps"] == 9 * 16 * 8
    graph = build_graph(spec)
    cluster = Cluster.from_spec(spec.cluster.model_copy(update={"cpus": 2, "gpus": 0}))
    assert cached_fits(graph, device_kinds(graph, cluster))["env.step"].fit.batch_sizes == (4, 8)


def test_a_profile_whose_worker_fails_keeps_its_runs_for_the_user_to_read(tmp_path):
    crashing = ["workers.policy.class=tests.workers_for_tests.Crashing", "~workers.policy.args", "flow.sync=[]"]
    overrides = [f"run.output_dir={tmp_path}", "flow.loop.horizon=8", *crashing]
    with pytest.raises(WorkerError) as caught:
        measure_profile(load_spec(ROOT / "configs" / "spin_balanced.yaml", overrides))
    assert "policy exploded on purpose" in str(caught.value)
    (note,) = caught.value.__notes__
    kept = Path(note.removeprefix("m2flow profile: its runs are kept in "))
    assert kept.is_dir() and any(kept.iterdir())
    shutil.rmtree(kept)
