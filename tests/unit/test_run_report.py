"""The end-of-run report covers the iterations the plan predicts; a port that runs once in k iterations is predicted
for the runs it had in them, not at the plan's average rate."""

from __future__ import annotations

import pytest

from m2flow.cluster import Cluster
from m2flow.config import spec_from_dict
from m2flow.graph import build_graph
from m2flow.planners import make_plan
from m2flow.runtime.iteration_metrics import Measured
from m2flow.runtime.reporting import Reporter
from m2flow.runtime.run_report import SparseRuns, measured_iterations, report_run, sparse_runs
from m2flow.viz.tables import drift_notes
from tests.unit.test_symmetry import spin_workflow


def test_the_measured_iterations_leave_out_the_first_and_an_asynchronous_segment_s_last_update_alone():
    history = [{"iteration": i, "time/loop_s": 1.0} for i in range(4)] + [{"iteration": 4}]  # 4: training alone
    assert [h["iteration"] for h in measured_iterations(history, 0, has_loop=True)] == [1, 2, 3]
    assert [h["iteration"] for h in measured_iterations(history, 2, has_loop=True)] == [3]
    assert [h["iteration"] for h in measured_iterations(history, 0, has_loop=False)] == [1, 2, 3, 4]


def plan_with_a_sync_every(every: int, other_sync_from_the_same_source: bool = False):
    raw = spin_workflow(4, 2, cpus=4, mode="hybrid", stages=2)
    raw["flow"]["sync"][0]["every"] = every
    if other_sync_from_the_same_source:  # trainer.weights feeds an every-iteration sync too, to a policy watched apart
        raw["workers"]["watcher"] = {**raw["workers"]["policy"], "replicas": 1}
        raw["flow"]["sync"].append({"edge": "trainer.weights -> watcher.load_weights"})
    spec = spec_from_dict(raw)
    return make_plan(build_graph(spec), Cluster.from_spec(spec.cluster))


def test_ports_only_a_sync_every_third_iteration_calls_count_their_runs_in_the_measured_iterations():
    plan = plan_with_a_sync_every(3)
    sparse = sparse_runs(plan, [1, 2, 3, 4, 5])  # the warm-up, iteration 0, where it also ran, is not measured
    assert sparse == {"trainer.weights": SparseRuns(3, 1, 5), "policy.load_weights": SparseRuns(3, 1, 5)}
    assert sparse["policy.load_weights"].rate == pytest.approx(0.6)
    assert sparse_runs(plan_with_a_sync_every(1), [1, 2, 3, 4, 5]) == {}
    mixed = sparse_runs(plan_with_a_sync_every(3, other_sync_from_the_same_source=True), [1, 2, 3, 4, 5])
    assert set(mixed) == {"policy.load_weights"}  # the weights' source runs every iteration as well
    assert mixed["policy.load_weights"] == SparseRuns(3, 1, 5)


def test_the_report_predicts_a_sparse_port_for_the_runs_it_had_and_says_so(tmp_path, capsys):
    plan = plan_with_a_sync_every(3)
    measured = Measured()
    measured.add("policy.load_weights", 0.5)
    ran = [{"iteration": i, "time/iteration_s": 0.2} for i in range(1, 6)]
    reporter = Reporter(tmp_path, total=6, start=0, show_progress=False)
    try:
        report = report_run(plan, measured, [], ran, False, reporter)
    finally:
        reporter.close()
    every_third = plan.predicted.port_s["policy.load_weights"]  # per iteration at one run in 3
    assert report.port_s["policy.load_weights"].predicted == pytest.approx(every_third * 0.6)
    assert report.port_s["policy.act"].predicted == pytest.approx(plan.predicted.port_s["policy.act"])
    assert report.sparse["policy.load_weights"] == SparseRuns(3, 1, 5)  # in report.json too
    said = " ".join(capsys.readouterr().err.split())
    assert "policy.load_weights: ran 1 time(s) in the 5 measured iterations, where one in 3 gives 1.67" in said


def test_a_port_more_than_25_percent_off_its_prediction_gets_a_drift_line_naming_its_source_and_what_was_done():
    spec = spec_from_dict(spin_workflow(4, 2, cpus=4, mode="hybrid", stages=2))  # the spin workers declare costs
    plan = make_plan(build_graph(spec), Cluster.from_spec(spec.cluster))
    predicted = plan.predicted.port_s
    assert plan.predicted.cost_sources["env.step"] == "declared" and predicted["env.step"] > 0
    iterations = 4
    measured = {port: seconds * iterations for port, seconds in predicted.items()}  # as predicted, over 4 iterations
    measured["env.step"] *= 1.5
    measured["policy.act"] *= 1.2  # within 25%: no line
    (line,) = drift_notes(plan, measured, iterations, calibrated=False)
    assert line.startswith("drift: env.step took 1.50x its predicted time (cost declared);")
    assert "workers.env.profile: correct it, or remove it to let m2flow measure" in line
    (line,) = drift_notes(plan, measured, iterations, calibrated=True)
    assert line.endswith("(the re-plan used the measured one)")
    plan.predicted.cost_sources["env.step"] = "measured (this run)"
    (line,) = drift_notes(plan, {**measured, "env.step": predicted["env.step"] * iterations * 0.5}, iterations, True)
    assert line == (
        "drift: env.step took 0.50x its predicted time (cost measured (this run)); the plan was re-planned on costs"
        " measured in this run; they are cached for the next runs"
    )
