"""A device's busy time is the union of its processes' spans of work: overlapping work counts once."""

from __future__ import annotations

import random

import pytest

from m2flow.cluster import DeviceId
from m2flow.runtime.iteration_metrics import Measured
from m2flow.runtime.spans import Spans


def covered_ms(spans_ms: list[tuple[int, int]]) -> int:
    """Milliseconds covered, by brute force."""
    return len({t for start, end in spans_ms for t in range(start, end)})


def test_overlapping_spans_count_once_and_disjoint_ones_add_up():
    spans = Spans()
    spans.add(0.0, 2.0)
    spans.add(1.0, 3.0)
    spans.add(5.0, 6.0)
    assert spans.total() == pytest.approx(4.0)
    assert (spans.starts, spans.ends) == ([0.0, 5.0], [3.0, 6.0])


def test_a_span_that_reaches_across_several_swallows_them_in_any_arrival_order():
    spans = Spans()
    for start, end in [(4.0, 5.0), (0.0, 1.0), (2.0, 3.0), (0.5, 4.5), (7.0, 7.0)]:
        spans.add(start, end)
    assert (spans.starts, spans.ends) == ([0.0], [5.0])
    assert spans.total() == pytest.approx(5.0)


def test_random_spans_total_what_they_cover():
    rng = random.Random(0)
    drawn = []
    spans = Spans()
    for _ in range(60):
        start = rng.randrange(0, 90_000)
        drawn.append((start, start + rng.randrange(1, 5_000)))
        spans.add(drawn[-1][0] / 1000, drawn[-1][1] / 1000)
    assert spans.total() == pytest.approx(covered_ms(drawn) / 1000, abs=1e-6)


def test_settled_spans_fold_into_a_total_and_later_work_reaching_back_is_cut_not_counted_twice():
    spans = Spans()
    for i in range(10):
        spans.add(float(i), i + 0.5)
    spans.settle(6.0)  # every call that started before 6 s has been added
    assert len(spans) == 4 and spans.total() == pytest.approx(5.0)
    spans.add(5.0, 9.75)  # reaches back past the folded spans: only what lies after them counts
    assert spans.total() == pytest.approx(6 * 0.5 + (9.75 - 6.0))


def test_a_late_training_span_over_many_loop_spans_of_two_processes_counts_once():
    gpu = DeviceId(0, "gpu", 0)
    measured = Measured(since=0.0)
    for process in range(2):  # two inference processes acting in turns, 600 calls each
        acting = Spans()
        for call in range(600):
            start = call * 0.01 + process * 0.005
            acting.add(start, start + 0.004)
        measured.busy(gpu).update(acting)
    measured.settle(-1.0)  # as the controller does while the training issued at -1 s runs: nothing folds yet
    measured.busy(gpu).add(-1.0, 10.0)  # training beside the loop, reported after it, begun in the warm-up
    measured.settle(10.0)
    assert measured.device_s[gpu] == pytest.approx(10.0)  # the window's 10 s, no more


def test_two_processes_on_one_device_make_it_busy_for_the_union_of_their_work():
    gpu = DeviceId(0, "gpu", 0)
    measured = Measured()
    inference, training = Spans(), Spans()
    for step in range(10):  # inference acts for 0.5 s of every second
        inference.add(step, step + 0.5)
    training.add(2.0, 8.0)  # training runs beside the loop for 6 s
    measured.busy(gpu).update(inference)
    measured.busy(gpu).update(training)
    assert measured.device_s[gpu] == pytest.approx(2 * 0.5 + 6.0 + 2 * 0.5)  # not 5 + 6 = 11 of 10 s


def test_a_copy_of_what_was_measured_is_untouched_by_later_work():
    gpu = DeviceId(0, "gpu", 0)
    measured = Measured()
    measured.add("rollout.act", 1.0)
    measured.busy(gpu).add(0.0, 1.0)
    before = measured.copy()
    measured.add("rollout.act", 1.0)
    measured.busy(gpu).add(2.0, 3.0)
    assert before.port_s["rollout.act"] == 1.0
    assert before.device_s == {gpu: 1.0}
