"""A loop port's fit, read from the few iterations traced call by call, set to the level the whole run measured.

A run traces its loop's calls one by one in its first iterations only (`run.trace_detail_iterations`, and until its
re-plans); after them each replica reports a port's seconds per iteration, not its calls. A fit of those first
iterations alone carries whatever slowed or sped them: on the 2-core machine three runs of the main job cached
`env.step` at 0.42-0.50 ms a call from their first iterations while each measured 0.38-0.42 ms over its 195
(`make_run_table_904683f`, `_bbb2a4a`), and the next run's plan was off by as much. The port keeps the shape its
calls gave (the per-call and per-item parts) and takes the level of the whole run: scaled by its seconds per
iteration over every measured iteration against those over the iterations traced call by call, both the running
workers' (since their last start). Where those workers traced no measured iteration (a switch at the last re-plan),
the fit stays as its calls gave it; sizes it holds from an earlier plan's iterations take the running workers'
factor too. Ports called outside the loop are traced call by call in every iteration: their fit is the whole run's
already.

Pure computation over m2flow's own trace events; no Ray, no torch.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from m2flow.planners.fit import PortFit, scaled
from m2flow.planners.trace_calls import STARTED, port_of_key, traced_replica


@dataclass(frozen=True)
class RunTotals:
    """Each port's wall seconds over the `iterations` the running workers measured, whether traced call by call or
    not (the controller's `Measured.port_s`)."""

    port_s: Mapping[str, float]
    iterations: frozenset[int]


def _traced_loop_seconds(events: list[dict], iterations: frozenset[int]) -> dict[str, dict[int, float]]:
    """Per loop port (`worker.port`), the running workers' calls' wall seconds in each of `iterations` that traced
    them one by one: those after the last start of the workers (a restart from a checkpoint runs, and may trace,
    an iteration again; what the workers before it traced is not in the totals)."""
    starts = [i for i, event in enumerate(events) if event.get("cat") == STARTED]
    seconds: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for event in events[starts[-1] + 1 if starts else 0 :]:
        args = event.get("args", {})
        if event.get("ph") != "X" or event.get("cat") != "loop" or event["name"].endswith("(busy)"):
            continue  # not a loop call, or an iteration's one-bar summary of a replica's loop
        if args.get("iteration") in iterations and "worker" in args:
            seconds[f"{traced_replica(event).worker}.{event['name']}"][args["iteration"]] += event["dur"] / 1e6
    return {port: dict(by_iteration) for port, by_iteration in seconds.items()}


def at_run_level(fitted: dict[str, PortFit], events: list[dict], totals: RunTotals) -> dict[str, PortFit]:
    """`fitted` with each loop port's fit scaled to the whole run's level (module doc); a port the run measured
    in no more iterations than it traced call by call, or not at all, as it was."""
    traced = _traced_loop_seconds(events, totals.iterations)
    out = dict(fitted)
    for key, fit in fitted.items():
        port = port_of_key(key)  # a port's calls beside rendering and alone: one level, from all its calls
        by_iteration = traced.get(port, {})
        if not by_iteration or len(by_iteration) >= len(totals.iterations):
            continue
        traced_s = sum(by_iteration.values()) / len(by_iteration)
        whole_s = totals.port_s.get(port, 0.0) / len(totals.iterations)
        if traced_s > 0 and whole_s > 0:
            out[key] = scaled(fit, whole_s / traced_s)
    return out
