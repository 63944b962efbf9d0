"""The per-iteration program a plan runs, and its ops — written once, interpreted twice.

`build_phases` turns the macro graph into phases (sync edges, the loop, the after-loop edges). Each
phase's op is a short function over an `Interpreter`: the controller interprets it with Ray calls
(handles are object references), the planner's event simulator with predicted tasks (handles are task
ids). Which ports are called, in what order, on which inputs, and how calls are split over replicas
(the dispatch rules) is therefore decided here once, for execution and prediction alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from m2flow.graph import MacroGraph
from m2flow.schedule import Phase
from m2flow.sharding import shards_of
from m2flow.spec import Edge, PortRef

H = TypeVar("H")


class Interpreter(Protocol, Generic[H]):
    """What an op asks of whoever runs it."""

    graph: MacroGraph

    def swap(self, phase: Phase) -> None:
        """The context switches before `phase`: offloads, then onloads."""

    def call(self, port: PortRef, inputs: list[list[H]], phase: Phase) -> list[H]:
        """Call `port` on its worker's replicas, `inputs[i]` being what its i-th input edge carries (one
        handle per source shard), split over replicas by the port's dispatch rule; returns the outputs
        that stand for the worker downstream (its gather rule)."""

    def copy_state(self, port: PortRef, state: H, phase: Phase) -> None:
        """Every replica of `port`'s worker receives the one `state` (a sync edge)."""

    def loop(self, phase: Phase) -> None:
        """The interaction loop: `horizon` steps over every replica and pipeline slice."""

    def streamed(self, phase: Phase) -> dict[PortRef, list[H]]:
        """Outputs of then-sources already produced while the loop ran (streamed then-edges)."""

    def end_phase(self, phase: Phase, produced: dict[PortRef, list[H]]) -> None:
        """The phase's calls are all issued: wait for them (executor) or schedule them (simulator)."""


def _sync(phase: Phase, run: Interpreter) -> None:
    (edge,) = phase.edges
    state = run.call(edge.src, [], phase)[0]
    run.copy_state(edge.dst, state, phase)
    run.end_phase(phase, {})


def _loop(phase: Phase, run: Interpreter) -> None:
    run.loop(phase)
    run.end_phase(phase, {})


def _then(phase: Phase, run: Interpreter) -> None:
    """After-loop ports in dependency order, each fed every output of its input edges."""
    produced = run.streamed(phase)
    for port in run.graph.then_order:
        if port not in produced:
            produced[port] = run.call(port, [produced[src] for src in run.graph.then_inputs(port)], phase)
    run.end_phase(phase, produced)


OPS: dict[str, Callable[[Phase, Interpreter], None]] = {"sync": _sync, "loop": _loop, "then": _then}


def run_phase(phase: Phase, run: Interpreter) -> None:
    """One phase: its context switches first, then its op."""
    run.swap(phase)
    OPS[phase.op](phase, run)


def build_phases(graph: MacroGraph) -> list[Phase]:
    """Sync edges first (state copies before the loop that uses them), the loop, then the after-loop edges.
    In an asynchronous flow the after-loop edges come before the loop and run beside it, on a batch an
    earlier loop collected (`m2flow.overlap`)."""
    phases = [Phase("sync", [sync.edge], sync.every) for sync in graph.sync]
    loop = [Phase("loop", list(graph.spec.flow.loop.edges))] if graph.loop is not None else []
    if not graph.then:
        return phases + loop
    if graph.spec.flow.asynchronous is not None:
        return [*phases, Phase("then", list(graph.then), overlaps=True), *loop]
    return [*phases, *loop, Phase("then", list(graph.then), streamed=streamable(graph))]


def own_items(graph: MacroGraph, worker: str, replica: int, op: str) -> float:
    """Items (env steps) a call without inputs works on: a state copy 1; a loop worker's replica the
    steps of the shards it owns; any other worker an even share of the iteration's steps."""
    loop_steps = graph.loop_steps
    if op == "sync" or not loop_steps:
        return 1
    loop = graph.loop
    replicas = graph.workers[worker].count
    if worker in loop.workers:
        n_shards = graph.workers[loop.entry.worker].count
        return loop_steps * len(shards_of(n_shards, replicas, replica)) / n_shards
    return loop_steps / replicas


def part_port(edge: Edge) -> PortRef:
    """The destination's `<port>_part`, which receives a streamed then-edge's parts."""
    return PortRef(worker=edge.dst.worker, port=f"{edge.dst.port}_part")


def streamable(graph: MacroGraph) -> list[Edge]:
    """Then-edges from a loop worker into a port whose class also takes parts (`<port>_part(parts)`)."""
    loop_workers = set(graph.loop.workers) if graph.loop is not None else set()
    return [
        e for e in graph.then if e.src.worker in loop_workers and part_port(e).port in graph.info[e.dst.worker].ports
    ]
