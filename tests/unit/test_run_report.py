"""The end-of-run report covers the iterations the plan predicts."""

from __future__ import annotations

from m2flow.runtime.run_report import measured_iterations


def test_the_measured_iterations_leave_out_the_first_and_an_asynchronous_segment_s_last_update_alone():
    history = [{"iteration": i, "time/loop_s": 1.0} for i in range(4)] + [{"iteration": 4}]  # 4: training alone
    assert [h["iteration"] for h in measured_iterations(history, 0, has_loop=True)] == [1, 2, 3]
    assert [h["iteration"] for h in measured_iterations(history, 2, has_loop=True)] == [3]
    assert [h["iteration"] for h in measured_iterations(history, 0, has_loop=False)] == [1, 2, 3, 4]
