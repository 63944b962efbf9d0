"""Fitting port costs from traced calls."""

from __future__ import annotations

import json

import pytest

from m2flow.errors import PlanError
from m2flow.planners.fit import (
    PortFit,
    SizeMean,
    fit_line,
    fit_points,
    fit_trace_file,
    line_through_means,
    load_profile,
    merged,
    save_profile,
)
from m2flow.planners.trace_calls import STARTED, points_from_trace, replica_points, work_share
from m2flow.spec import PortCost


def test_fit_recovers_fixed_and_per_item_cost():
    points = [(items, 0.002 + 0.0005 * items) for items in (1, 2, 4, 8, 8, 4)]
    fit = fit_line(points)
    assert fit.fixed_s == pytest.approx(0.002) and fit.per_item_s == pytest.approx(0.0005)


def test_one_batch_size_puts_everything_per_item_and_no_items_is_fixed():
    per_item = fit_line([(4, 0.004), (4, 0.006)])
    assert per_item.fixed_s == 0.0 and per_item.per_item_s == pytest.approx(0.00125)
    fixed = fit_line([(0, 0.01), (0, 0.03)])
    assert fixed.fixed_s == pytest.approx(0.02) and fixed.per_item_s == 0.0


def test_a_second_batch_size_seen_in_another_run_splits_the_per_call_cost_from_the_per_item_one():
    whole = fit_points({"env.step": [(8, 0.020)] * 4}, "run 1")["ports"]["env.step"]  # 8 envs a call
    sliced = fit_points({"env.step": [(4, 0.019), (4, 0.021)]}, "run 2")["ports"]["env.step"]  # slices of 4
    assert sliced.per_item_s * 8 == pytest.approx(0.040)  # alone, one size reads as all per item
    both = merged(whole, sliced)  # the same at both sizes: all per call
    assert both.fixed_s == pytest.approx(0.020) and both.per_item_s == 0.0
    assert both.batch_sizes == (4, 8) and both.calls == 6


# env.step of the Meta-World camera job on the 2-core machine (benchmarks/RESULTS.md, planner_accuracy_cpu_dec06):
# its means at 4 and 8 envs, from runs of other process layouts, and the cost a third size (2) showed it has
METAWORLD_MEANS = [(4, 0.0350), (8, 0.0648)]
METAWORLD_TRUE = PortCost(fixed_s=0.00101, per_item_s=0.00804)


def test_a_per_call_part_read_from_two_noisy_sizes_is_shrunk_and_predicts_a_smaller_slice_closer():
    unshrunk, shrunk = fit_line(METAWORLD_MEANS), line_through_means(METAWORLD_MEANS)
    assert unshrunk.fixed_s == pytest.approx(0.0052)  # five times the per-call cost it has
    assert shrunk.fixed_s < 0.5 * unshrunk.fixed_s

    def at(cost: PortCost, items: int) -> float:
        return cost.fixed_s + cost.per_item_s * items

    truth = at(METAWORLD_TRUE, 2)  # a slice of 2 envs, as a plan of 4 stages cuts 8
    assert abs(at(shrunk, 2) - truth) < 0.5 * abs(at(unshrunk, 2) - truth)


def test_a_per_call_part_the_sizes_show_as_none_stays_none():
    means = [(4, 0.0365), (8, 0.0730)]  # twice the envs, twice the time
    assert line_through_means(means) == fit_line(means) and fit_line(means).fixed_s == 0.0


def test_a_cost_that_falls_with_the_batch_stays_all_per_call_with_no_per_item_part():
    means = [(16, 0.0021), (64, 0.0020)]
    line = line_through_means(means)
    assert line == fit_line(means) and line.fixed_s == pytest.approx(0.00205) and line.per_item_s == 0.0


def test_a_per_call_part_far_above_its_noise_keeps_nearly_all_of_itself():
    means = [(16, 0.0020), (64, 0.0021)]  # an act call on a GPU: flat across batch sizes
    line = line_through_means(means)
    assert line.fixed_s == pytest.approx(fit_line(means).fixed_s, rel=0.03)


def test_the_shrunk_line_keeps_its_cost_at_the_sizes_mean():
    line = line_through_means(METAWORLD_MEANS)
    assert line.fixed_s + line.per_item_s * 6 == pytest.approx((0.0350 + 0.0648) / 2)


def test_a_batch_size_seen_again_takes_its_latest_cost_and_one_seen_alone_keeps_its_own_fit():
    earlier = fit_points({"env.step": [(4, 0.010), (8, 0.030)]}, "run 1")["ports"]["env.step"]
    later = fit_points({"env.step": [(8, 0.020)]}, "run 2")["ports"]["env.step"]
    both = merged(earlier, later)
    assert both.by_size == (SizeMean(4, pytest.approx(0.010), 1), SizeMean(8, pytest.approx(0.020), 1))
    assert both.fixed_s == pytest.approx(0.0) and both.per_item_s == pytest.approx(0.0025)
    assert merged(None, later) == later and merged(later, earlier) == earlier  # nothing seen that it did not see


def test_coefficients_never_go_negative():
    fit = fit_line([(1, 0.010), (2, 0.009), (4, 0.008)])  # noisy, falling: no negative per-item cost
    assert fit.per_item_s >= 0 and fit.fixed_s >= 0


def test_trace_points_skip_warm_up_and_controller_rows():
    def event(name, worker, iteration, items, dur_us, cat="loop"):
        return {
            "ph": "X",
            "name": name,
            "cat": cat,
            "dur": dur_us,
            "args": {"worker": worker, "iteration": iteration, "items": items},
        }

    trace = {
        "traceEvents": [
            event("step", "env[0]", 0, 4, 9000),  # warm-up: left out
            event("step", "env[0]", 1, 4, 2000),
            event("step", "env[1]", 1, 2, 1000),
            event("sync", "controller", 1, 0, 5000, cat="phase"),
        ]
    }
    points = points_from_trace(trace)
    assert points == {"env.step": [(4.0, 0.002), (2.0, 0.001)]}
    assert fit_points(points, "test")["ports"]["env.step"].per_item_s == pytest.approx(0.0005)


def test_a_replicas_first_two_calls_at_a_batch_size_new_to_its_port_on_a_gpu_are_a_warm_up_its_first_on_a_core():
    # merged slices: the policy acted on 16 rows, then took in slices for a call on 64 rows, whose first call
    # captured a CUDA graph for the new shape (19 ms), whose second was that graph's first replay, uploading it
    # (7.7 ms), and whose third ran as the shape runs (3.3 ms), as on an H100 (benchmarks/results/gpu44)
    trace = {
        "traceEvents": [
            _task("act", "policy[0]", "n0/gpu0", 0.00, 0.002, items=16, iteration=0),  # the first iteration
            _task("act", "policy[0]", "n0/gpu0", 0.10, 0.002, items=16),
            _task("act", "policy[0]", "n0/gpu0", 0.20, 0.019, items=64),  # its first call at 64 rows
            _task("act", "policy[0]", "n0/gpu0", 0.25, 0.0077, items=64),  # and its second
            _task("act", "policy[0]", "n0/gpu0", 0.30, 0.0033, items=64),
            _task("act", "policy[0]", "n0/gpu0", 0.35, 0.002, items=16),  # a size it ran before
            _task("act", "policy[1]", "n0/gpu0", 0.40, 0.0035, items=64),  # another replica's own shapes
            _task("act", "policy[1]", "n0/gpu0", 0.50, 0.0036, items=64),
            _task("step", "env[0]", "n0/cpu0", 0.10, 0.001, items=4),
            _task("step", "env[0]", "n0/cpu0", 0.20, 0.004, items=8),  # its first call at 8 envs: left out
            _task("step", "env[0]", "n0/cpu0", 0.30, 0.002, items=8),  # its second: fitted
        ]
    }
    points = points_from_trace(trace)
    assert points["policy.act"] == [(16.0, 0.002), (64.0, 0.0033), (16.0, 0.002), (64.0, 0.0035), (64.0, 0.0036)]
    assert points["env.step"] == [(4.0, pytest.approx(0.001)), (8.0, pytest.approx(0.002))]


def test_a_message_s_cost_is_the_line_through_the_hops_seen_at_each_size_all_per_message_at_one_size():
    from m2flow.runtime.profiling import message_cost

    line = message_cost([(2, 1e-4 + 2 * 3e-5), (4, 1e-4 + 4 * 3e-5), (8, 1e-4 + 8 * 3e-5)])
    assert line == {"hop_s": pytest.approx(1e-4), "hop_item_s": pytest.approx(3e-5)}
    assert message_cost([(8, 2e-4)]) == {"hop_s": pytest.approx(2e-4), "hop_item_s": 0.0}
    assert message_cost([]) == {}


def test_the_channel_hop_is_the_wait_of_an_idle_consumer():
    from m2flow.planners.trace_calls import hop_from_trace

    def event(worker, port, step, ts_us, dur_us):
        return {
            "ph": "X",
            "cat": "loop",
            "name": port,
            "ts": ts_us,
            "dur": dur_us,
            "args": {"worker": worker, "iteration": 1, "step": step, "stage": 0, "items": 4},
        }

    chain = ["env.obs", "policy.act", "env.step"]
    trace = {
        "traceEvents": [
            event("env[0]", "step", 0, 0, 1000),  # ends at 1000 us
            event("policy[0]", "act", 1, 1100, 500),  # 100 us after: a hop
            event("env[0]", "step", 1, 1700, 1000),  # 100 us after the policy: a hop
            event("policy[0]", "act", 2, 2800, 500),
        ]
    }
    assert hop_from_trace(trace, chain) == pytest.approx(1e-4)


def _task(name, worker, device, start_s, seconds, items=4, iteration=1, cat="loop"):
    return {
        "ph": "X",
        "name": name,
        "cat": cat,
        "ts": start_s * 1e6,
        "dur": seconds * 1e6,
        "args": {"worker": worker, "device": device, "iteration": iteration, "items": items},
    }


def test_a_trace_refit_leaves_out_the_first_iteration_after_each_start_the_trace_marks(tmp_path):
    """`m2flow profile --from-trace` of a run that switched plans at iteration 3: that iteration warmed its new
    workers up (10x slower here), as the trace's start marks say, and is left out as the run left it out."""
    calls = [_task("step", "env[0]", "n0/cpu0", it, 0.05 if it == 3 else 0.005, iteration=it) for it in range(6)]
    marks = [
        {"ph": "i", "cat": STARTED, "name": "workers started", "args": {"iteration": it, "plan": "p"}} for it in (0, 3)
    ]
    path = tmp_path / "trace.json"
    for events, step_s in ((calls, (4 * 0.005 + 0.05) / 5), (marks + calls, 0.005)):
        path.write_text(json.dumps({"traceEvents": events}))
        fit = fit_trace_file(path, ["env.step"])["ports"]["env.step"]
        assert fit.calls == (5 if events is calls else 4)
        assert fit.cost.per_item_s * 4 == pytest.approx(step_s)


def test_a_trace_refit_of_rows_m2flow_does_not_write_is_refused_as_not_its_trace(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": [_task("step", "env", "n0/cpu0", 0.0, 0.005, iteration=1)]}))
    with pytest.raises(PlanError, match="is JSON but not a trace m2flow wrote"):
        fit_trace_file(path, ["env.step"])


def test_two_calls_that_ran_at_once_on_one_core_each_count_half_of_that_time():
    trace = {"traceEvents": [_task("step", "env[0]", "n0/cpu0", 0, 2.0), _task("step", "env[1]", "n0/cpu0", 0, 2.0)]}
    assert points_from_trace(trace) == {"env.step": [(4.0, pytest.approx(1.0)), (4.0, pytest.approx(1.0))]}


def test_calls_that_overlap_in_part_share_only_the_overlap():
    trace = {"traceEvents": [_task("step", "env[0]", "n0/cpu0", 0, 2.0), _task("act", "policy[0]", "n0/cpu0", 1, 2.0)]}
    points = points_from_trace(trace)
    assert points["env.step"] == [(4.0, pytest.approx(1.5))] and points["policy.act"] == [(4.0, pytest.approx(1.5))]


def test_calls_at_once_on_two_cores_or_on_a_gpu_keep_their_wall_time():
    trace = {
        "traceEvents": [
            _task("step", "env[0]", "n0/cpu0", 0, 2.0),
            _task("step", "env[1]", "n0/cpu1", 0, 2.0),
            _task("act", "policy[0]", "n0/gpu0", 0, 1.0),
            _task("act", "policy[1]", "n0/gpu0", 0, 1.0),
        ]
    }
    points = points_from_trace(trace)
    assert points["env.step"] == [(4.0, 2.0), (4.0, 2.0)] and points["policy.act"] == [(4.0, 1.0), (4.0, 1.0)]


def test_a_warm_up_call_still_takes_its_share_of_the_core_from_a_measured_one():
    trace = {
        "traceEvents": [
            _task("step", "env[0]", "n0/cpu0", 0, 2.0, iteration=0),  # left out, yet it ran beside the next
            _task("step", "env[1]", "n0/cpu0", 0, 2.0, iteration=1),
        ]
    }
    assert points_from_trace(trace) == {"env.step": [(4.0, pytest.approx(1.0))]}


def test_calls_that_touch_end_to_start_share_nothing():
    trace = {"traceEvents": [_task("step", "env[0]", "n0/cpu0", 0, 1.0), _task("step", "env[1]", "n0/cpu0", 1, 1.0)]}
    assert points_from_trace(trace) == {"env.step": [(4.0, pytest.approx(1.0)), (4.0, pytest.approx(1.0))]}


def test_a_weight_sync_waiting_on_its_peer_takes_no_share_of_the_core():
    trace = {
        "traceEvents": [
            _task("train", "actor[0]", "n0/cpu0", 0, 2.0, cat="call"),
            _task("load_weights", "rollout[0]", "n0/cpu0", 0, 2.0, cat="sync"),
        ]
    }
    points = points_from_trace(trace)
    assert points["actor.train"] == [(4.0, pytest.approx(2.0))]
    assert points["rollout.load_weights"] == [(4.0, pytest.approx(2.0))]


def test_the_work_share_reads_a_ports_wall_time_as_its_work():
    trace = {
        "traceEvents": [
            _task("step", "env[0]", "n0/cpu0", 0, 2.0),
            _task("step", "env[1]", "n0/cpu0", 0, 2.0),
            _task("act", "policy[0]", "n0/cpu1", 0, 1.0),
        ]
    }
    assert work_share(trace) == {"env.step": pytest.approx(0.5), "policy.act": pytest.approx(1.0)}


def test_a_port_outside_the_loop_keeps_each_replicas_share_of_its_cost_and_a_loop_port_none():
    trace = {
        "traceEvents": [
            _task("evaluate", "env[0]", "n0/cpu0", 0, 9.0, items=1, iteration=0, cat="sync"),  # warm-up: left out
            _task("evaluate", "env[1]", "n0/cpu1", 0, 9.0, items=1, iteration=0, cat="sync"),
            *[_task("evaluate", "env[0]", "n0/cpu0", 10 * it, 1.4, items=1, iteration=it, cat="sync") for it in (1, 2)],
            *[_task("evaluate", "env[1]", "n0/cpu1", 10 * it, 0.0, items=1, iteration=it, cat="sync") for it in (1, 2)],
            _task("train", "actor[0]", "n0/cpu0", 5, 0.2, items=200, cat="call"),  # uneven shards, alike per item
            _task("train", "actor[1]", "n0/cpu1", 5, 0.1, items=100, cat="call"),
            _task("load_weights", "rollout[1]", "n0/cpu1", 6, 0.1, cat="sync"),  # its replica 0 not seen
            _task("reset", "spare[0]", "n0/cpu0", 6, 0.1, cat="call"),  # its last replica, spare[1], not seen
            _task("step", "env[0]", "n0/cpu0", 7, 0.2),  # in the loop
            _task("step", "env[1]", "n0/cpu1", 7, 0.1),
        ]
    }
    by_replica = replica_points(trace, {"env": 2, "actor": 2, "rollout": 2, "spare": 2})
    assert set(by_replica) == {"env.evaluate", "actor.train"}
    fits = fit_points(points_from_trace(trace), "test", by_replica=by_replica)["ports"]
    assert fits["env.evaluate"].replica_shares == {2: pytest.approx((2.0, 0.0))}
    assert fits["actor.train"].replica_shares == {2: pytest.approx((1.0, 1.0))}  # the line counts the items
    assert fits["env.step"].replica_shares == {}
    evaluate = fits["env.evaluate"]
    assert 2.0 * (evaluate.fixed_s + evaluate.per_item_s) == pytest.approx(1.4)  # replica 0's own, by its share


def test_a_merged_fit_keeps_the_replica_shares_latest_measured_at_each_replica_count():
    earlier = PortFit(0.1, 0.0, 2, (0,), (SizeMean(0, 0.1, 2),), replica_shares={2: (2.0, 0.0)})
    unmeasured = PortFit(0.2, 0.0, 2, (4,), (SizeMean(4, 0.2, 2),))
    assert merged(earlier, unmeasured).replica_shares == {2: (2.0, 0.0)}
    assert merged(earlier, PortFit(0.1, 0.0, 2, (0,), (SizeMean(0, 0.1, 2),))).replica_shares == {2: (2.0, 0.0)}
    at_three = PortFit(0.2, 0.0, 3, (4,), (SizeMean(4, 0.2, 3),), replica_shares={3: (3.0, 0.0, 0.0)})
    assert merged(earlier, at_three).replica_shares == {2: (2.0, 0.0), 3: (3.0, 0.0, 0.0)}
    remeasured = PortFit(0.2, 0.0, 2, (4,), (SizeMean(4, 0.2, 2),), replica_shares={2: (1.2, 0.8)})
    assert merged(earlier, remeasured).replica_shares == {2: (1.2, 0.8)}


def test_a_profile_file_keeps_its_json_format_and_reads_back_as_the_same_fits(tmp_path):
    by_replica = {"env.evaluate": {0: [(1, 1.4)], 1: [(1, 0.0)]}}
    points = {"env.step": [(4, 0.010), (8, 0.030), (8, 0.032)], "env.evaluate": [(1, 1.4), (1, 0.0)]}
    profile = {**fit_points(points, "test", by_replica=by_replica), "hop_s": 1e-4}
    path = save_profile(profile, tmp_path / "profile.json")
    assert json.loads(path.read_text())["ports"]["env.evaluate"]["replica_shares"] == {"2": [2.0, 0.0]}
    step = json.loads(path.read_text())["ports"]["env.step"]
    assert list(step) == ["fixed_s", "per_item_s", "calls", "batch_sizes", "by_size", "residual", "replica_shares"]
    assert step["batch_sizes"] == [4, 8] and step["by_size"] == [[4, 0.010, 1], [8, pytest.approx(0.031), 2]]
    assert load_profile(path) == profile


def test_a_fit_written_by_hand_with_only_its_cost_reads_as_nothing_measured():
    written_by_hand = PortFit.from_dict({"fixed_s": 0.001, "per_item_s": 0.0002})  # or before a key existed
    assert written_by_hand == PortFit(fixed_s=0.001, per_item_s=0.0002, calls=0, batch_sizes=(), by_size=())


@pytest.mark.parametrize(
    "fit",
    [
        pytest.param({"fixed": 0.001, "per_item_s": 0.0002}, id="a-misspelt-cost"),
        pytest.param({"fixed_s": 0.001, "per_item_s": 0.0002, "by_size": [[4, 0.002]]}, id="a-short-row"),
        pytest.param({"fixed_s": "fast", "per_item_s": 0.0002}, id="a-cost-that-is-no-number"),
        pytest.param({"fixed_s": 0.1, "per_item_s": 0.0, "replica_shares": {"2": [2.0]}}, id="shares-not-2-of-them"),
        pytest.param({"fixed_s": 0.1, "per_item_s": 0.0, "replica_shares": [2.0, 0.0]}, id="shares-not-by-count"),
    ],
)
def test_a_damaged_profile_file_is_refused_naming_the_file_and_the_port(tmp_path, fit):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"source": "hand", "ports": {"env.step": fit}}))
    with pytest.raises(PlanError, match=r"profile\.json: ports\.env\.step does not read as a measured cost"):
        load_profile(path)
