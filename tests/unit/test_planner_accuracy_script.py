"""benchmarks/planner_accuracy.py and replay_calibration.py: a candidate whose run fails, or a workload whose
calibrating run fails, is recorded with its error and run folder, and the sweep's table shows it, rather than the
sweep ending with nothing saved; kept GPU sweeps replayed offline, and what their traces marked."""

import dataclasses
import importlib
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from m2flow.errors import WaitTimeout, WorkerError
from m2flow.planners.render import ReplicaPort, beside_rendering
from m2flow.planners.trace_calls import STARTED, traced_replica

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def benchmarks(monkeypatch):
    """The benchmarks folder's modules, imported as its scripts run: siblings importable by name."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return SimpleNamespace(
        accuracy=importlib.import_module("planner_accuracy"),
        tables=importlib.import_module("tables_planner"),
        io=importlib.import_module("results_io"),
    )


def _spec(run_dir: Path) -> SimpleNamespace:
    """What the script reads of a run's spec to find its folder."""
    return SimpleNamespace(name=run_dir.name, run=SimpleNamespace(output_dir=str(run_dir.parent)))


def test_a_failed_candidate_keeps_its_error_and_its_run_folder_without_checkpoints_in_place_of_an_earlier_one(
    benchmarks, tmp_path
):
    run_dir = tmp_path / "runs" / "ppo-metaworld-camera"
    (run_dir / "stacks").mkdir(parents=True)
    (run_dir / "stacks" / "host-123.txt").write_text('File "threading.py", line 331 in wait')
    (run_dir / "checkpoints" / "iter_00000001").mkdir(parents=True)
    planned = SimpleNamespace(predicted=SimpleNamespace(iteration_s=1.5), processes=[])
    error = WaitTimeout("waited 60s for the sync phase (iteration 0)")
    stale = tmp_path / "results" / "failed-ppo-metaworld-camera-hybrid-S2" / "from-an-earlier-sweep.txt"
    stale.parent.mkdir(parents=True)
    stale.write_text("")
    row = benchmarks.accuracy.failed_row("hybrid", 2, planned, error, _spec(run_dir), tmp_path / "results")
    kept = Path(row["kept"])
    assert kept == stale.parent and not stale.exists()  # replaced, not merged with an earlier sweep's
    assert (kept / "stacks" / "host-123.txt").read_text().endswith("in wait")
    assert not (kept / "checkpoints").exists()
    assert row["failed"] == str(error) and row["predicted_s"] == 1.5 and "measured_s" not in row


def test_a_co_hosted_candidate_keeps_its_run_folder_apart_from_the_plain_one(benchmarks, tmp_path):
    run_dir = tmp_path / "runs" / "ppo"
    run_dir.mkdir(parents=True)
    error, spec = WaitTimeout("waited"), _spec(run_dir)
    names = {
        Path(benchmarks.accuracy.failed_row("shared", 2, plan, error, spec, tmp_path / "results")["kept"]).name
        for plan in (
            SimpleNamespace(predicted=SimpleNamespace(iteration_s=1.0), processes=[]),
            SimpleNamespace(predicted=SimpleNamespace(iteration_s=1.0), processes=[["env[0]", "env[1]"]]),
        )
    }
    assert names == {"failed-ppo-shared-S2", "failed-ppo-shared-S2-co-hosted"}


def test_the_accuracy_table_shows_a_failed_candidate_beside_the_measured_ones(benchmarks, tmp_path):
    rows = [
        {"mode": "shared", "stages": 1, "predicted_s": 1.0, "measured_s": 1.1, "error": 0.1, "auto": True},
        {"mode": "hybrid", "stages": 2, "predicted_s": 2.0, "failed": "waited 60s", "auto": False},
    ]
    payload = {"args": {"iterations": 5}, "workloads": [{"workload": "metaworld", "rows": rows}], "summary": "s"}
    benchmarks.io.save_result("planner_accuracy", payload, tmp_path)
    block = benchmarks.tables.planner_accuracy("planner_accuracy.json", benchmarks.io.Results(tmp_path))
    text = "\n".join(block.lines)
    assert "| metaworld | shared S=1 | 1.000 | 1.100 | +10.0% | auto |" in text
    assert "| metaworld | hybrid S=2 | 2.000 | failed |  |  |" in text


def test_the_accuracy_table_of_rounds_shows_each_round_s_prediction_and_its_own_error_and_a_relaid_layout(
    benchmarks, tmp_path
):
    rows = [
        {
            "mode": "shared",
            "stages": 1,
            "predicted_s": 1.0,
            "rounds_predicted_s": [1.0, 0.8],
            "measured_s": 0.9,
            "rounds_s": [0.9, 0.88],
            "error": -0.1,
            "co_hosted": True,
            "relaid": True,
            "auto": True,
        },
        {
            "mode": "hybrid",
            "stages": 2,
            "predicted_s": 2.0,
            "rounds_predicted_s": [2.0, 2.2],
            "rounds_s": [2.1],
            "failed": "waited 60s",
            "failed_round": 2,
            "auto": False,
        },
    ]
    payload = {
        "args": {"iterations": 5, "rounds": 2},
        "workloads": [{"workload": "main", "rows": rows}],
        "summary": "s",
    }
    benchmarks.io.save_result("planner_accuracy", payload, tmp_path)
    text = "\n".join(benchmarks.tables.planner_accuracy("planner_accuracy.json", benchmarks.io.Results(tmp_path)).lines)
    assert (
        "| main | shared S=1 co-hosted | 1.000 (1.000, 0.800) | 0.900 (0.900, 0.880) | -10.0% | -10.0%, +10.0%"
        " | auto, relaid |" in text
    )
    assert "| main | hybrid S=2 | 2.000 (2.000, 2.200) | failed |  | +5.0% |  |" in text
    assert "each round's own error beside" in text


def test_a_workload_whose_calibrating_run_fails_is_recorded_with_its_run_folder_and_shown_in_the_table(
    benchmarks, tmp_path, monkeypatch
):
    def fails(spec):
        (Path(spec.run.output_dir) / spec.name / "stacks").mkdir(parents=True)
        raise WorkerError("env[0] failed in step: ValueError")

    monkeypatch.setattr(benchmarks.accuracy.mf, "run", fails)
    keep = tmp_path / "results"
    result = benchmarks.accuracy.bench(
        "main", benchmarks.accuracy.WORKLOADS["main"], 2, 3, ["auto"], tmp_path / "runs", keep, warm_up=False
    )
    assert result["rows"] == [] and result["auto_within_5pct"] is False
    assert result["calibration"]["failed"] == "env[0] failed in step: ValueError"
    assert (Path(result["calibration"]["kept"]) / "stacks").is_dir()
    payload = {"args": {"iterations": 2}, "workloads": [result], "summary": "s"}
    benchmarks.io.save_result("planner_accuracy", payload, tmp_path)
    text = "\n".join(benchmarks.tables.planner_accuracy("planner_accuracy.json", benchmarks.io.Results(tmp_path)).lines)
    assert "| main | calibrating run (auto) |  | failed |  |  |" in text


def test_rounds_run_every_candidate_as_planned_right_before_in_alternating_order_and_measure_the_median(
    benchmarks, tmp_path, monkeypatch
):
    """Three rounds; each run's prediction is the number of runs before it (as if each run taught the cache), so
    a prediction planned earlier than right before its run would show; one candidate fails in its second run."""
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(tmp_path / "cache"))
    events, runs = [], []
    real_make_plan = benchmarks.accuracy.make_plan

    def layout(spec):  # what sets a candidate apart: its placement, and its replica count (another's, alike placed)
        return spec.placement, spec.workers["env"].replicas

    def make_plan(graph, cluster, **kwargs):
        plan = real_make_plan(graph, cluster, **kwargs)
        events.append(("plan", layout(graph.spec), len(runs)))
        return dataclasses.replace(plan, predicted=dataclasses.replace(plan.predicted, iteration_s=float(len(runs))))

    def run(spec):
        events.append(("run", layout(spec), len(runs)))
        runs.append(layout(spec))
        if len(runs) > 1 and runs[-1] == runs[1] and runs.count(runs[-1]) == 2:
            raise WorkerError("env[0] failed in step")  # the first candidate, in its second round
        calibrated = SimpleNamespace(notes=[], label="shared S=1", predicted=SimpleNamespace(cost_sources={}))
        seconds = 1.0 + len(runs) ** 2 / 100  # later runs ever slower: the median of three is not their mean
        return SimpleNamespace(
            plan=calibrated, history=[{"time/iteration_s": 99.0}] + [{"time/iteration_s": seconds}] * 2
        )

    monkeypatch.setattr(benchmarks.accuracy, "make_plan", make_plan)
    monkeypatch.setattr(benchmarks.accuracy.mf, "run", run)
    workload = benchmarks.accuracy.WORKLOADS["spin-per-call"]
    result = benchmarks.accuracy.bench(
        "spin", workload, 3, 3, ["auto"], tmp_path / "runs", tmp_path / "keep", rounds=3, warm_up=False
    )
    rows, candidates = result["rows"], runs[1 : 1 + len(result["rows"])]  # runs[0]: the calibrating run
    assert len(rows) > 2
    assert runs[1 + len(rows) :] == candidates[::-1] + candidates[1:]  # round 3: the failed first candidate not again
    for i, event in enumerate(events):  # every candidate run planned right before it, from the cache as it is then
        if event[0] == "run" and event[2] > 0:
            assert events[i - 1] == ("plan", event[1], event[2])
    failed, measured = rows[0], rows[1:]
    assert failed["failed"] == "env[0] failed in step" and failed["failed_round"] == 2
    assert len(failed["rounds_s"]) == 1 and failed["predicted_s"] == 1.0  # its first run's prediction: one run before
    for k, row in enumerate(measured, start=2):
        assert row["predicted_s"] == float(k) == row["rounds_predicted_s"][0]  # as its first run started
        assert len(row["rounds_s"]) == 3 and row["measured_s"] == sorted(row["rounds_s"])[1] != sum(row["rounds_s"]) / 3


def test_beside_the_modes_the_sweep_runs_each_other_replica_count_auto_weighs_and_the_hand_layout(
    benchmarks, tmp_path, monkeypatch
):
    """The camera workload on the 2-core machine: 16 envs in 2 simulator processes or 1 (auto's allocation search
    weighs both); the count the modes already ran is not run again, the other is, at auto's mode for it; the
    RLinf-style hand layout runs through the manual planner."""
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(tmp_path / "cache"))
    runs = []

    def run(spec):
        runs.append(spec)
        calibrated = SimpleNamespace(notes=[], label="shared S=1", predicted=SimpleNamespace(cost_sources={}))
        return SimpleNamespace(plan=calibrated, history=[{"time/iteration_s": 1.0}] * 3)

    monkeypatch.setattr(benchmarks.accuracy.mf, "run", run)
    workload = benchmarks.accuracy.WORKLOADS["camera"]
    result = benchmarks.accuracy.bench("camera", workload, 3, 3, ["auto"], tmp_path / "runs", tmp_path, warm_up=False)
    pairs = list(zip(result["rows"], runs[1:], strict=True))  # runs[0]: the calibrating run
    variants = {row["variant"]: (row, spec) for row, spec in pairs}
    assert set(variants) == {"", "env 1 x 16", "by hand: env: 0, rollout: 1, actor: 1"}
    _, one_process = variants["env 1 x 16"]
    assert one_process.workers["env"].replicas == 1 and one_process.workers["env"].args["num_envs"] == 16
    one_row = variants["env 1 x 16"][0]  # at the mode and stages auto planned for one process before any run
    assert (one_process.placement.mode, one_process.placement.pipeline_stages) == (one_row["mode"], one_row["stages"])
    by_hand, hand_spec = variants["by hand: env: 0, rollout: 1, actor: 1"]
    assert by_hand["mode"].startswith("manual") and by_hand["stages"] == 2
    assert hand_spec.placement.devices == {"env": 0, "rollout": 1, "actor": 1}
    assert all(spec.workers["env"].replicas == 2 for row, spec in pairs if not row["variant"])
    assert sum(row["auto"] for row in result["rows"]) == 1
    benchmarks.io.save_result(
        "planner_accuracy", {"args": {"iterations": 3}, "workloads": [result], "summary": "s"}, tmp_path
    )
    text = "\n".join(benchmarks.tables.planner_accuracy("planner_accuracy.json", benchmarks.io.Results(tmp_path)).lines)
    assert "| camera | manual (hybrid) S=2 (by hand: env: 0, rollout: 1, actor: 1) |" in text
    assert " (env 1 x 16) |" in text and "an RLinf-style layout by hand" in text


def test_a_warm_up_run_caching_apart_comes_before_the_calibrating_run_which_weighs_every_mode_and_stage_count(
    benchmarks, tmp_path, monkeypatch
):
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(tmp_path / "cache"))
    runs = []

    def run(spec):
        runs.append((spec.run.iterations, spec.placement, os.environ["M2FLOW_COST_CACHE"]))
        if len(runs) == 2:
            raise WorkerError("env[0] failed in step")  # the calibrating run: the sweep of this workload ends there

    monkeypatch.setattr(benchmarks.accuracy.mf, "run", run)
    benchmarks.accuracy.bench(
        "main", benchmarks.accuracy.WORKLOADS["main"], 2, 9, ["auto"], tmp_path / "runs", tmp_path
    )
    (warm_up, warm_up_placement, warm_up_cache), (calibrating, placement, cache) = runs
    assert warm_up == benchmarks.accuracy.WARM_UP_ITERATIONS and warm_up_placement.replan is False
    assert warm_up_cache != cache == str(tmp_path / "cache")  # what the warm-up measured is not the calibration's
    assert calibrating == 9 and (placement.mode, placement.pipeline_stages) == ("auto", "auto")  # the config's: 1


def test_no_rounds_is_refused(benchmarks):
    with pytest.raises(benchmarks.accuracy.argparse.ArgumentTypeError, match="at least one round"):
        benchmarks.accuracy.at_least_one("0")


def test_keep_traces_copies_each_run_s_trace_plan_processes_metrics_and_report_under_its_label(benchmarks, tmp_path):
    run_dir = tmp_path / "runs" / "ppo-camera"
    run_dir.mkdir(parents=True)
    for name in benchmarks.accuracy.TRACE_FILES:
        (run_dir / name).write_text(name)
    (run_dir / "checkpoints").mkdir()
    benchmarks.accuracy.keep_trace(_spec(run_dir), tmp_path / "traces", "hybrid-S2-round1")
    kept = tmp_path / "traces" / "ppo-camera-hybrid-S2-round1"
    assert sorted(p.name for p in kept.iterdir()) == sorted(benchmarks.accuracy.TRACE_FILES)
    assert all((kept / name).read_text() == name for name in benchmarks.accuracy.TRACE_FILES)
    benchmarks.accuracy.keep_trace(_spec(run_dir), None, "calibrating")  # without --keep-traces: nothing kept
    assert [p.name for p in (tmp_path / "traces").iterdir()] == ["ppo-camera-hybrid-S2-round1"]


def test_the_gpu44_sweep_replayed_chooses_within_5_percent_of_its_fastest_plan_and_predicts_each_within_10(monkeypatch):
    """On an H100 (benchmarks/results/gpu44) auto chose hybrid S=2, 8.6% slower than shared S=1: the calibrating
    run's trace put the policy's 64-row call at 5.5 ms, the mean of its CUDA graph's first replay (7.7 ms) and the
    call after (3.3 ms). The planner refits that trace here, the warm-up calls left out, and plans again; the
    measured times are the sweep's."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    replayed = importlib.import_module("replay_calibration").replay(BENCHMARKS / "results" / "gpu44", gpus=1, cpus=16)
    assert replayed["auto_within_5pct"], replayed["summary"]
    assert all(abs(row["error"]) <= 0.10 for row in replayed["rows"]), replayed["summary"]
    assert len(replayed["rows"]) == 6


def test_the_cnn_sweep_replayed_with_a_trial_of_one_stage_chooses_within_5_percent_where_its_calibration_did_not(
    monkeypatch,
):
    """On an H100 (benchmarks/results/gpu48, the camera job with a CNN policy) the calibrating run, hybrid S=2,
    measured the policy's act only beside the other stage's rendering, and auto chose hybrid S=2, 18.5% slower
    than shared S=1, whose act alone took half as long. Replayed with the sweep's shared S=1 run after it, as a
    re-plan's trial of one stage would have run it, each plan is costed with what its own kind of plan measured:
    auto is within 5% of the fastest, and the plans of two stages or more (not fitted to the trial's run) within
    10% of what they measured."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    replay = importlib.import_module("replay_calibration").replay
    sweep = BENCHMARKS / "results" / "gpu48"
    assert not replay(sweep, gpus=1, cpus=16)["auto_within_5pct"]
    tried = replay(sweep, gpus=1, cpus=16, trial="shared-S1-round1")
    assert tried["auto_within_5pct"], tried["summary"]
    pipelined = [row for row in tried["rows"] if row["stages"] > 1]
    assert len(pipelined) == 4 and all(abs(row["error"]) <= 0.10 for row in pipelined), tried["summary"]


def test_the_gpu49_runs_traced_as_beside_rendering_the_calls_their_plans_run_beside_rendering_and_no_others(
    benchmarks,
):
    """On an H100 (benchmarks/results/gpu49, the camera job with a CNN policy, code a9f41b5) the controller marked a
    loop call `beside_rendering` where the running plan ran its replica's port beside rendering on one GPU: in each
    candidate's kept trace the marked calls are those `beside_rendering` names for its plan (every act and step of
    the two- and four-stage plans, none of the one-stage ones); the calibrating run marked its hybrid S=2 iterations'
    acts and none after it switched to the one-stage trial."""
    replay = importlib.import_module("replay_calibration")  # importable: the `benchmarks` fixture

    def traced(events: list[dict], *, beside: bool) -> list[dict]:
        return [e for e in events if e.get("cat") == "loop" and bool(e["args"].get("beside_rendering")) == beside]

    with replay.unpacked(BENCHMARKS / "results" / "gpu49") as tmp:
        workload = benchmarks.accuracy.WORKLOADS["camera-cnn-gpu"]
        spec = benchmarks.accuracy.spec_of(workload, tmp, "cluster.gpus=1", "cluster.cpus=16")
        stages = {}
        for folder in sorted((tmp / "traces").glob("*-round1")):
            run = replay.kept_run(folder, spec)
            marked = {ReplicaPort(traced_replica(e), e["name"]) for e in traced(run.events, beside=True)}
            planned = beside_rendering(run.graph, run.plan.placements, run.plan.pipeline_stages, run.plan.cluster)
            assert marked == planned, folder.name
            assert {port.port for port in marked} == ({"act", "step"} if run.plan.pipeline_stages > 1 else set())
            stages[folder.name] = run.plan.pipeline_stages
        assert sorted(stages.values()) == [1, 1, 2, 2, 4, 4]
        (calibrating,) = (tmp / "traces").glob("*-calibrating")
        acts = [e for e in replay.kept_run(calibrating, spec).events if e.get("cat") == "loop" and e["name"] == "act"]
        switched = min(e["args"]["iteration"] for e in traced(acts, beside=False))
        assert switched == 3
        assert all(e["args"]["iteration"] < switched for e in traced(acts, beside=True))
        assert {e["args"]["iteration"] for e in traced(acts, beside=True)} == {0, 1, 2}


def test_a_calibrating_run_that_switched_plans_is_replayed_from_where_its_trace_marks_the_switch(monkeypatch):
    """gpu49's calibrating run ran hybrid S=2 for iterations 0-2, then its re-plan's trial, hybrid S=1, from
    iteration 3 (a warm-up) on; its trace predates the marks of where workers start. With them added as the run
    now writes them, the replay refits what the run refitted: shared S=1, the sweep's first candidate after the
    calibration (its prediction read nothing else), is predicted as the sweep predicted it; unmarked, iteration 3's
    warm-up counts, and the replay predicts it 14% slower."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    replay = importlib.import_module("replay_calibration")
    sweep = BENCHMARKS / "results" / "gpu49"

    def shared_s1(result: dict) -> dict:
        return next(row for row in result["rows"] if (row["mode"], row["stages"]) == ("shared", 1))

    unmarked = shared_s1(replay.replay(sweep, gpus=1, cpus=16))
    assert unmarked["predicted_s"] > 1.1 * unmarked["sweep_predicted_s"]

    kept_run = replay.kept_run

    def with_starts(folder: Path, spec):
        run = kept_run(folder, spec)
        if not folder.name.endswith("-calibrating"):
            return run
        starts = [(0, "hybrid S=2"), (3, "hybrid S=1")]
        marks = [{"cat": STARTED, "ph": "i", "args": {"iteration": i, "plan": plan}} for i, plan in starts]
        return run._replace(events=marks + run.events)

    monkeypatch.setattr(replay, "kept_run", with_starts)
    replayed = replay.replay(sweep, gpus=1, cpus=16)
    assert shared_s1(replayed)["predicted_s"] == pytest.approx(shared_s1(replayed)["sweep_predicted_s"], rel=0.005)
    assert replayed["auto"] == "hybrid S=1"  # as the sweep's auto chose


@pytest.mark.parametrize("name", ["main", "camera", "metaworld", "spin-per-call", "camera-vit-gpu", "camera-cnn-gpu"])
def test_every_workload_plans_auto_on_the_machine_it_is_for_with_its_policy_where_the_machine_has_a_gpu(
    benchmarks, tmp_path, name
):
    """A workload the sweep runs on a lent GPU machine is planned here as there (1 GPU, 16 cores): a mistyped
    override would otherwise be found only on the device; the policy's inference goes to the GPU where there is
    one, and a CPU workload plans on this machine's two cores."""
    accuracy = benchmarks.accuracy
    on_gpu = name.endswith("-gpu")
    machine = ("cluster.gpus=1", "cluster.cpus=16") if on_gpu else ("cluster.cpus=2",)
    spec = accuracy.spec_of(accuracy.WORKLOADS[name], tmp_path, *machine)
    plan = accuracy.make_plan(accuracy.build_graph(spec), accuracy.Cluster.from_spec(spec.cluster), mode="auto")
    policy = next(p for worker, p in plan.placements.items() if worker in ("rollout", "policy"))
    assert policy.device_kind == ("gpu" if on_gpu else "cpu")
