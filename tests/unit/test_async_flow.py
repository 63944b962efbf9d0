"""Asynchronous flows without Ray: the schedule of loops beside training, the declaration, the prediction."""

from __future__ import annotations

import pytest

from m2flow.cluster import Cluster
from m2flow.config import dump_spec, parse_yaml, spec_from_dict
from m2flow.errors import SpecError
from m2flow.graph import build_graph
from m2flow.overlap import Overlap
from m2flow.planners import make_plan, profile_of
from m2flow.planners.cache import load_calibration, save_calibration
from m2flow.runtime.replan import beside_slowdown, remember_beside
from m2flow.schedule import Plan
from tests.unit.test_planner import plan_of, workflow


@pytest.mark.parametrize(
    ("k", "lags"),
    [(0, [0, 0, 0, 0, 0]), (1, [0, 1, 1, 1, 1]), (2, [0, 1, 2, 2, 2]), (9, [0, 1, 2, 3, 4])],
)
def test_each_batch_trains_at_most_max_staleness_versions_late_and_exactly_that_once_the_queue_is_full(k, lags):
    assert Overlap(k).staleness(10, 14) == lags


def test_a_segment_ends_with_no_batch_pending_and_the_next_fills_again():
    overlap = Overlap(1)
    # iteration 0 of a segment 0..2: fill batch 0, collect batch 1 beside training
    assert (overlap.fills(0, 0, 2), overlap.prefetches(0, 1, 2)) == (1, True)
    assert (overlap.fills(1, 2, 2), overlap.prefetches(1, 2, 2)) == (0, True)
    assert (overlap.fills(2, 3, 2), overlap.prefetches(2, 3, 2)) == (0, False)  # batch 3 is the next segment's
    assert overlap.fills(3, 3, 5) == 1
    assert "mean 0.98 over a 49-iteration segment" in overlap.explain(49)


def async_workflow(k: int = 1, **kwargs) -> dict:
    raw = workflow(**kwargs)
    raw["flow"]["async"] = {"max_staleness": k}
    return raw


def test_the_async_key_round_trips_through_yaml():
    spec = spec_from_dict(async_workflow(2))
    assert spec.flow.asynchronous.max_staleness == 2
    text = dump_spec(spec)
    assert "async:\n    max_staleness: 2" in text
    assert spec_from_dict(parse_yaml(text, "round trip")) == spec


def test_an_async_flow_refuses_a_loop_worker_port_with_after_loop_inputs_and_offload_always():
    raw = async_workflow()
    raw["flow"]["then"].append("learner.train -> env.obs")
    raw["placement"]["offload"] = "always"
    with pytest.raises(SpecError) as err:
        build_graph(spec_from_dict(raw))
    text = str(err.value)
    assert "flow.then[1] 'learner.train -> env.obs': under flow.async a loop worker's after-loop ports" in text
    assert "placement.offload: 'always' swaps workers out between phases" in text
    raw = async_workflow(2)
    raw["placement"]["replan"] = True
    raw["run"] = {"checkpoint_every": 2}
    raw["workers"]["learner"]["class"] = "tests.workers_for_tests.Collect"
    raw["workers"]["policy"]["class"] = "tests.workers_for_tests.PlusOne"
    raw["flow"]["sync"] = [{"edge": "learner.train -> policy.act", "every": 3}]
    with pytest.raises(SpecError) as err:
        build_graph(spec_from_dict(raw))
    text = str(err.value)
    assert "placement.replan" not in text  # re-planned after synchronous calibration iterations
    assert "run.checkpoint_every: 2 ends a segment" in text
    assert "flow.sync[0] 'learner.train -> policy.act': every 3 keeps the loop's policy up to 2 version(s)" in text
    raw = async_workflow()
    raw["flow"].pop("then")
    with pytest.raises(SpecError, match="flow.async: overlaps the after-loop edges with the loop"):
        build_graph(spec_from_dict(raw))


def test_training_on_its_own_device_hides_behind_the_loop_in_the_prediction():
    # loop: 100 steps x (2 ms env + 2 ms policy) on two devices; training on a third
    sync = plan_of(workflow(cpus=3, mode="disaggregated"))
    overlapped = plan_of(async_workflow(cpus=3, mode="disaggregated"))
    then = next(p for p in overlapped.phases if p.op == "then")
    assert then.overlaps and [p.op for p in overlapped.phases] == ["then", "loop"]
    loop_s, then_s = overlapped.predicted.phase_s["loop"], overlapped.predicted.phase_s["then"]
    assert then_s == pytest.approx(sync.predicted.phase_s["then"])
    assert overlapped.predicted.hidden_s == pytest.approx(min(loop_s, then_s))
    assert sync.predicted.iteration_s - overlapped.predicted.iteration_s == pytest.approx(min(loop_s, then_s))
    assert Plan.from_dict(overlapped.to_dict()).phases[0].overlaps
    assert any(n.startswith("async: training overlaps the loop; each batch trains 1 policy") for n in overlapped.notes)


def test_training_that_shares_the_loop_s_device_hides_nothing_it_cannot():
    # one device: the loop and training take turns on it, so overlapping gains nothing
    sync = plan_of(workflow(cpus=1, mode="shared"))
    overlapped = plan_of(async_workflow(cpus=1, mode="shared"))
    assert overlapped.predicted.iteration_s == pytest.approx(sync.predicted.iteration_s, rel=1e-6)


def test_messages_the_policy_receives_load_its_process_not_the_gpu_training_shares_beside_the_loop():
    # the simulator on a core, acting and training on one GPU; each loop message costs a 2 ms hop, so the loop
    # (100 steps x (2 ms env + 0.2 ms act + two hops) = 0.62 s) outlasts the GPU's own work (0.02 s of acting
    # and 0.5 s of training): training hides behind the loop whole, however long the acting process receives
    raw = async_workflow(cpus=1, mode="shared", policy_s=0.0002)
    raw["cluster"]["gpus"] = 1
    raw["workers"]["learner"]["profile"]["train"]["fixed_s"] = 0.5
    graph = build_graph(spec_from_dict(raw))
    cluster = Cluster.from_spec(graph.spec.cluster)
    profile = profile_of(graph, cluster)
    profile.hop_s = 0.002
    plan = make_plan(graph, cluster, profile)
    assert {d.kind for p in ("policy", "learner") for d in plan.placements[p].replica_devices} == {"gpu"}
    predicted = plan.predicted
    assert predicted.phase_s["loop"] > 0.6
    assert predicted.hidden_s == pytest.approx(predicted.phase_s["then"])


def test_shared_async_puts_training_on_the_device_the_loop_loads_least():
    sync = plan_of(workflow(cpus=2, mode="shared"))
    overlapped = plan_of(async_workflow(cpus=2, mode="shared"))
    assert [d.name for d in sync.placements["learner"].replica_devices] == ["n0/cpu0"]  # round-robin from the first
    assert [d.name for d in overlapped.placements["learner"].replica_devices] == ["n0/cpu1"]  # beside the loop
    assert [d.name for d in overlapped.placements["env"].replica_devices] == ["n0/cpu0"]
    assert overlapped.predicted.hidden_s > 0


def test_ports_of_one_worker_run_in_the_order_the_then_edges_first_name_them():
    raw = workflow()
    raw["workers"]["buffer"] = {"kind": "buffer", "class": "m2flow.workers.buffer.ReplayBuffer"}
    adds_first = ["env.trajectory -> buffer.add", "buffer.sample -> learner.train"]
    for then in (adds_first, adds_first[::-1]):
        raw["flow"]["then"] = then
        order = [str(p) for p in build_graph(spec_from_dict(raw)).then_order]
        named = [edge.split(" -> ")[i] for edge in then for i in (0, 1) if edge.split(" -> ")[i].startswith("buffer")]
        assert [p for p in order if p.startswith("buffer.")] == named, order


def test_drop_mode_drops_the_oldest_queued_batches_over_the_bound_and_trains_one_per_training_s_worth_of_loops():
    overlap = Overlap(1, drops=True)
    assert overlap.stale([3, 4, 5], version=5) == 1  # batch of version 3 would train 2 versions late
    assert overlap.stale([4, 5], version=5) == 0
    assert Overlap(0, drops=True).stale([4, 5], version=5) == 1
    assert [overlap.trains_one_in(0.1, train_s) for train_s in (0.05, 0.1, 0.25, 0.3)] == [1, 1, 3, 3]


def test_drop_mode_predicts_the_loop_s_pace_and_the_share_of_batches_trained():
    raw = async_workflow(1, cpus=3, mode="disaggregated")
    raw["workers"]["learner"]["profile"]["train"]["fixed_s"] = 1.0  # a loop is ~0.4 s: 100 steps of 4 ms
    blocking = plan_of(raw)
    raw["flow"]["async"]["on_stale"] = "drop"
    dropping = plan_of(raw)
    loop_s = dropping.predicted.phase_s["loop"]
    assert blocking.predicted.iteration_s == pytest.approx(1.0 + blocking.predicted.phase_s["controller"], rel=0.01)
    assert dropping.predicted.iteration_s == pytest.approx(loop_s + dropping.predicted.phase_s["controller"])
    assert dropping.predicted.trains_one_in == 3 == -(-1.0 // loop_s)
    assert any("on_stale: drop" in n and "about 1 batch in 3 trains" in n for n in dropping.notes)
    assert Plan.from_dict(dropping.to_dict()).predicted.trains_one_in == 3


def test_a_class_s_port_dispatch_names_its_own_ports_with_dispatch_rules():
    raw = workflow()
    raw["workers"]["learner"]["class"] = "tests.workers_for_tests.MisdeclaredDispatch"
    with pytest.raises(SpecError) as err:
        build_graph(spec_from_dict(raw))
    text = str(err.value)
    assert "workers.learner: tests.workers_for_tests.MisdeclaredDispatch.port_dispatch: 'nope' is not one of" in text
    assert "MisdeclaredDispatch.port_dispatch['train']: expected m2flow.Dispatch(split=..., gather=...)" in text


def test_drop_mode_refuses_max_staleness_0_which_would_train_at_most_every_other_batch():
    raw = async_workflow(0)
    raw["flow"]["async"]["on_stale"] = "drop"
    with pytest.raises(SpecError, match="on_stale: drop with max_staleness 0 drops every batch collected while"):
        build_graph(spec_from_dict(raw))


def test_an_asynchronous_flow_measures_its_costs_on_its_synchronous_twin_when_the_run_is_long_enough():
    from m2flow.runtime.replan import MAX_REPLANS, calibration

    graph = build_graph(spec_from_dict(async_workflow()))
    measuring = calibration(graph, ["policy.act"], iterations_left=10)
    assert measuring.replans == 1 and measuring.twin.spec.flow.asynchronous is None
    assert measuring.twin.spec.workers == graph.spec.workers
    assert "they run synchronously (training beside the loop would skew them)" in measuring.says[0]
    short = calibration(graph, ["policy.act"], iterations_left=4)  # 3 to measure, 1 async warm-up: none measured
    assert (short.replans, short.twin) == (0, None) and "has too few after them" in short.says[0]
    assert calibration(graph, [], iterations_left=10).replans == 0  # every cost known (placement.replan: auto)
    synchronous = calibration(build_graph(spec_from_dict(workflow())), ["policy.act"], iterations_left=10)
    assert (synchronous.replans, synchronous.twin) == (MAX_REPLANS, None)
    assert "in the first 3 iterations, then re-planning" in synchronous.says[0]
    brief = calibration(build_graph(spec_from_dict(workflow())), ["policy.act"], iterations_left=2)
    assert "this run's 2 iteration(s), too few to re-plan after 3; they are cached" in brief.says[0]


def test_work_on_a_device_both_the_loop_and_training_load_takes_the_measured_slowdown_longer():
    def predicted(raw: dict, slowdown: float) -> float:
        graph = build_graph(spec_from_dict(raw))
        cluster = Cluster.from_spec(graph.spec.cluster)
        profile = profile_of(graph, cluster)
        profile.beside_slowdown = slowdown
        return make_plan(graph, cluster, profile).predicted.iteration_s

    one_device = async_workflow(cpus=1, mode="shared")  # the loop and training take turns on it
    assert predicted(one_device, 1.7) == pytest.approx(1.7 * predicted(one_device, 1.0), rel=0.02)
    apart = async_workflow(cpus=3, mode="disaggregated")  # training on a device of its own: nothing shared
    assert predicted(apart, 1.7) == pytest.approx(predicted(apart, 1.0), rel=1e-9)


def test_an_asynchronous_run_s_iterations_give_the_slowdown_back_and_it_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("M2FLOW_COST_CACHE", str(tmp_path))
    graph = build_graph(spec_from_dict(async_workflow(cpus=1, mode="shared")))  # every cost declared
    cluster = Cluster.from_spec(graph.spec.cluster)
    plan = make_plan(graph, cluster)
    truth = profile_of(graph, cluster)
    truth.beside_slowdown = 1.7
    measured_s = make_plan(graph, cluster, truth).predicted.iteration_s
    assert beside_slowdown(graph, cluster, plan, measured_s) == pytest.approx(1.7, rel=1e-4)
    assert beside_slowdown(graph, cluster, plan, 0.5 * measured_s) == 1.0  # faster than alone: no slowdown
    alone_s = plan.predicted.iteration_s
    assert beside_slowdown(graph, cluster, plan, 1.04 * alone_s) == 1.0  # within noise of no slowdown: none read
    assert beside_slowdown(graph, cluster, plan, 1.06 * alone_s) > 1.0
    said = remember_beside(graph, cluster, plan, [measured_s] * 3)
    assert said is not None and "took 1.70x its time alone" in said
    save_calibration(graph, {"hop_item_s": 0.001})  # a later calibration keeps the slowdown beside it
    assert load_calibration(graph) == {"beside_slowdown": pytest.approx(1.7, rel=1e-4), "hop_item_s": 0.001}
    assert profile_of(graph, cluster).beside_slowdown == pytest.approx(1.7, rel=1e-4)
    unmeasured = async_workflow(cpus=1, mode="shared")
    unmeasured["workers"]["learner"].pop("profile")  # its update left to a default: nothing to read it against
    graph = build_graph(spec_from_dict(unmeasured))
    assert beside_slowdown(graph, cluster, make_plan(graph, cluster), measured_s) is None


def test_the_synchronous_twin_an_asynchronous_flow_measures_on_reads_what_the_flow_s_earlier_runs_cached(
    tmp_path, monkeypatch
):
    from m2flow.runtime.replan import synchronous_twin

    monkeypatch.setenv("M2FLOW_COST_CACHE", str(tmp_path))
    graph = build_graph(spec_from_dict(async_workflow(cpus=1, mode="shared")))
    save_calibration(graph, {"hop_item_s": 0.001, "controller_s": 0.02, "beside_slowdown": 1.5})  # an earlier run's
    twin = synchronous_twin(graph)
    assert load_calibration(twin) == load_calibration(graph)
    profile = profile_of(twin, Cluster.from_spec(twin.spec.cluster))  # what its re-plan refits from
    assert (profile.hop_item_s, profile.controller_s) == (0.001, 0.02)
