"""The controller: one coarse call per worker per phase, in the order the plan's phases give.

Bulk data (trajectories, weights) moves between workers as Ray object references; the driver never
touches it. Per-step loop data moves over the workers' own channels (see `loop.py`).
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from m2flow.errors import SpecError, WorkerError
from m2flow.graph import MacroGraph
from m2flow.runtime.checkpoint import load_checkpoint, save_checkpoint
from m2flow.runtime.deadlines import Deadlines
from m2flow.runtime.launch import Launch, Replica
from m2flow.runtime.loop import LoopProgram, LoopStats
from m2flow.runtime.tracing import Trace
from m2flow.runtime.waits import Deadline, wait_all
from m2flow.schedule import Phase, Plan
from m2flow.spec import Edge, PortRef


@dataclass
class IterationResult:
    metrics: dict[str, float] = field(default_factory=dict)
    env_steps: int = 0


class Controller:
    def __init__(self, graph: MacroGraph, plan: Plan, launch: Launch, trace: Trace, trace_until: int):
        self.graph = graph
        self.plan = plan
        self.launch = launch
        self.trace = trace
        self.trace_until = trace_until  # iterations before this one trace every micro task
        self.deadlines = Deadlines.from_plan(plan, graph.spec.run.timeouts)
        self._phases = {"sync": self._sync, "loop": self._loop, "then": self._then}
        self._streamed: tuple[dict, list] = ({}, [])  # then-phase work submitted with the loop
        self.measured = Measured()

    def iteration(self, it: int) -> IterationResult:
        result = IterationResult()
        start = time.time()
        for phase in self.plan.phases:
            if it % phase.every:
                continue
            self._swap(phase, it, result)
            began = time.time()
            self._phases[phase.op](phase, it, result)
            seconds = time.time() - began
            result.metrics[f"time/{phase.op}_s"] = result.metrics.get(f"time/{phase.op}_s", 0.0) + seconds
            self.trace.task(
                "controller", "controller", (phase.op, "phase", began, time.time(), -1, 0, 0, 0), iteration=it
            )
        result.metrics.update(self._worker_metrics())
        elapsed = time.time() - start
        result.metrics["time/iteration_s"] = elapsed
        if result.env_steps:
            result.metrics["env/steps_per_s"] = result.env_steps / elapsed
        return result

    # -- phases ----------------------------------------------------------------------------------
    def _swap(self, phase: Phase, it: int, result: IterationResult) -> None:
        """The context switches the plan puts before this phase: offloads first, then onloads."""
        began = time.time()
        for op, workers in (("offload", phase.offload), ("onload", phase.onload)):
            calls = [(r.actor.swap.remote(op), r, f"{op}()") for w in workers for r in self.launch.replicas[w]]
            self._record(
                wait_all(calls, self._deadline(f"{op} of {', '.join(workers)}", it, "swap")), [c[1] for c in calls], it
            )
        if phase.offload or phase.onload:
            result.metrics["time/swap_s"] = result.metrics.get("time/swap_s", 0.0) + time.time() - began

    def _sync(self, phase: Phase, it: int, result: IterationResult) -> None:
        edge = Edge.model_validate(phase.edges[0])
        outs, calls = self._call(edge.src, it, [], [])
        self._record(wait_all(calls, self._deadline(f"sync {edge}", it, "sync")), [c[1] for c in calls], it)
        value_ref = outs[0][0]  # a Ray reference: the state goes from the training rank to each replica
        calls = []
        for r in self.launch.replicas[edge.dst.worker]:
            out, event = r.actor.call_single.options(num_returns=2).remote(edge.dst.port, it, value_ref)
            calls.append((event, r, f"sync {edge}"))
        events = wait_all(calls, self._deadline(f"sync {edge}", it, "sync"))
        self._record(events, [c[1] for c in calls], it)
        result.metrics["sync/bytes"] = float(events[0][7])

    def _loop(self, phase: Phase, it: int, result: IterationResult) -> None:
        loop = self.graph.loop
        program = LoopProgram(
            ports=tuple((p.worker, p.port) for p in loop.ports),
            horizon=loop.horizon,
            stages=self.plan.pipeline_stages,
            shards=self.graph.workers[loop.entry.worker].replicas,
            replicas={w: self.graph.workers[w].replicas for w in loop.workers},
            iteration=it,
            channel_timeout_s=self.deadlines.channel_s,
            trace_steps=it < self.trace_until,
        )
        processes: dict[int, list[Replica]] = {}  # one loop program per process, for every replica it hosts
        for r in (r for w in loop.workers for r in self.launch.replicas[w]):
            processes.setdefault(id(r.process), []).append(r)
        calls = [
            (group[0].process.run_loop.remote(program), group[0], f"loop of iteration {it}")
            for group in processes.values()
        ]
        self._streamed = self._stream(it)
        per_process: list[dict[str, LoopStats]] = wait_all(calls, self._deadline("the interaction loop", it, "loop"))
        members = [r for group in processes.values() for r in group]
        stats = [
            by_worker[r.worker] for group, by_worker in zip(processes.values(), per_process, strict=True) for r in group
        ]
        last = loop.ports[-1]
        for r, s in zip(members, stats, strict=True):
            device = self.plan.device_name(r.device)
            for port, seconds in s.seconds.items():
                self.measured.add(f"{r.worker}.{port}", device, seconds)
            for event in s.events:
                self.trace.task(f"{r.worker}[{r.index}]", device, event, iteration=it)
            if not program.trace_steps and s.seconds:
                busy = sum(s.seconds.values())
                self.trace.task(
                    f"{r.worker}[{r.index}]",
                    device,
                    ("loop (busy)", "loop", s.start, s.start + busy, -1, 0, sum(s.items.values()), s.sent_bytes),
                    iteration=it,
                )
            if r.worker == last.worker:
                result.env_steps += s.items.get(last.port, 0)
        result.metrics["loop/bytes_sent"] = float(sum(s.sent_bytes for s in stats))

    def _stream(self, it: int) -> tuple[dict, list]:
        """Streamed then-edges, submitted with the loop: each loop replica's output port is queued behind
        its own loop, and its part goes to the destination's `<port>_part` as soon as it exists, while
        other replicas still step. Returns what was produced and the calls to wait on in the then-phase."""
        then = next((p for p in self.plan.phases if p.op == "then"), None)
        produced: dict[str, list[tuple[Any, Replica]]] = {}
        calls: list = []
        for edge in (Edge.model_validate(e) for e in (then.streamed if then is not None else [])):
            if str(edge.src) not in produced:
                produced[str(edge.src)], source_calls = self._call(edge.src, it, [], [])
                calls += source_calls
            part_port = PortRef(worker=edge.dst.worker, port=f"{edge.dst.port}_part")
            for ref, _ in produced[str(edge.src)]:
                calls += self._call(part_port, it, [1], [ref])[1]
        return produced, calls

    def _then(self, phase: Phase, it: int, result: IterationResult) -> None:
        """After-loop ports in dependency order; their tasks count the iteration's env steps per replica,
        the unit the planner's cost model uses for them. Streamed sources were submitted with the loop."""
        produced, calls = self._streamed
        self._streamed = ({}, [])
        for port in self.graph.then_order:
            if str(port) in produced:
                continue
            inputs = [[ref for ref, _ in produced[str(src)]] for src in self.graph.then_inputs(port)]
            outs, port_calls = self._call(
                port, it, [len(refs) for refs in inputs], [r for refs in inputs for r in refs]
            )
            produced[str(port)] = outs
            calls += port_calls
        events = wait_all(calls, self._deadline("the after-loop phase", it, "then"))
        replicas = [c[1] for c in calls]
        steps = result.env_steps
        events = [
            (*e[:6], steps // len(self.launch.replicas[r.worker]), e[7]) for e, r in zip(events, replicas, strict=True)
        ]
        self._record(events, replicas, it)
        terminal = {str(p) for p in self.graph.then_order} - {str(e.src) for e in self.graph.then}
        for name in sorted(terminal):
            outputs = wait_all([(ref, r, name) for ref, r in produced[name]], self._deadline(name, it, "then"))
            result.metrics.update(_mean_of_dicts([item for per_replica in outputs for item in per_replica]))
        self._account(result, it)

    def _account(self, result: IterationResult, it: int) -> None:
        """Steps produced by the loop = steps consumed, for every consumer that reports `.../steps_consumed`."""
        if self.graph.loop is None:
            return
        consumed = {k: v for k, v in result.metrics.items() if k.endswith("/steps_consumed")}
        result.metrics["accounting/steps_produced"] = float(result.env_steps)
        for key, steps in consumed.items():
            if int(steps) != result.env_steps:
                raise WorkerError(
                    f"iteration {it}: the loop produced {result.env_steps} env steps but {key} reports"
                    f" {int(steps)}: steps were lost or counted twice between the loop and training"
                )

    # -- helpers ---------------------------------------------------------------------------------
    def _call(self, port: PortRef, it: int, counts: list[int], refs: list[Any]) -> tuple[list, list]:
        """Call `port` on every replica: (output refs downstream should use, trace-event calls to wait on).

        A multi-rank training worker is one data-parallel group: every rank is called (collectives),
        and rank 0's output stands for the group.
        """
        group = self.launch.replicas[port.worker]
        calls, outs = [], []
        for r in group:
            out, event = r.actor.call.options(num_returns=2).remote(port.port, it, counts, *refs)
            outs.append((out, r))
            calls.append((event, r, f"port {port}"))
        if self.graph.workers[port.worker].kind == "training":
            outs = outs[:1]
        return outs, calls

    def _record(self, events: list[tuple], group: list[Replica], it: int) -> None:
        for event, r in zip(events, group, strict=True):
            device = self.plan.device_name(r.device)
            self.trace.task(f"{r.worker}[{r.index}]", device, event, iteration=it)
            self.measured.add(f"{r.worker}.{event[0]}", device, event[3] - event[2])

    def _deadline(self, what: str, it: int, phase: str) -> Deadline:
        return Deadline(self.deadlines.phase(phase), f"{what} (iteration {it}); {self.deadlines.explain}")

    def _worker_metrics(self) -> dict[str, float]:
        """Average of what each replica's optional `metrics()` hook reports."""
        calls = [(r.actor.hook.remote("metrics"), r, "metrics()") for g in self.launch.replicas.values() for r in g]
        per_replica = wait_all(calls, Deadline(self.deadlines.phase("then"), "metrics() hooks"))
        return _mean_of_dicts([m for values in per_replica if values for m in values])

    # -- checkpoints -----------------------------------------------------------------------------
    def save_checkpoint(self, root: Path, iteration: int, meta: dict) -> Path:
        """One atomic checkpoint directory: `state.pt` with what workers return from `state_dict()`, and
        `<worker>/` for workers that write their own files (`save_checkpoint(path)`: a training group
        writes its shards there together, every rank at once)."""
        return save_checkpoint(root, iteration, self._states(), meta, write_files=self._write_files)

    def restore(self, checkpoint: Path) -> None:
        state, _ = load_checkpoint(checkpoint)
        self._load_states(state)
        self._read_files(checkpoint)

    def _files(self, directory: Path, name: str, replica: int) -> Path:
        """Where a worker's own files go: one folder for a training group, one per replica otherwise."""
        return directory / name if self.graph.workers[name].kind == "training" else directory / name / str(replica)

    def _write_files(self, directory: Path) -> None:
        calls = [
            (r.actor.hook.remote("save_checkpoint", str(self._files(directory, name, r.index))), r, "save_checkpoint()")
            for name, group in self.launch.replicas.items()
            for r in group
        ]
        wait_all(calls, Deadline(self.deadlines.start_s, "save_checkpoint() hooks"))

    def _read_files(self, checkpoint: Path) -> None:
        saved = {p.name for p in checkpoint.iterdir() if p.is_dir()}
        unknown = saved - set(self.launch.replicas)
        if unknown:
            raise SpecError([f"workers: the checkpoint holds worker '{sorted(unknown)[0]}', this workflow has none"])
        calls = [
            (
                r.actor.hook.remote("load_checkpoint", str(self._files(checkpoint, name, r.index))),
                r,
                "load_checkpoint()",
            )
            for name in sorted(saved)
            for r in self.launch.replicas[name]
        ]
        wait_all(calls, Deadline(self.deadlines.start_s, "load_checkpoint() hooks on resume"))

    def _states(self) -> dict[str, list]:
        """Per worker, per replica, per instance state (a training group keeps rank 0's)."""
        state = {}
        for name, group in self.launch.replicas.items():
            calls = [(r.actor.hook.remote("state_dict"), r, "state_dict()") for r in group]
            values = wait_all(calls, Deadline(self.deadlines.start_s, f"{name}.state_dict()"))
            if values[0] is None:
                continue
            state[name] = values[:1] if self.graph.workers[name].kind == "training" else values
        return state

    def _load_states(self, state: dict[str, list]) -> None:
        calls = []
        for name, per_replica in state.items():
            group = self.launch.replicas.get(name)
            if group is None:
                raise SpecError([f"workers: the checkpoint holds worker '{name}', this workflow has none"])
            training = self.graph.workers[name].kind == "training"
            if not training and len(per_replica) != len(group):
                raise SpecError(
                    [
                        f"workers.{name}.replicas: the checkpoint has {len(per_replica)} replicas, the"
                        f" workflow {len(group)}; resume with the same replica count"
                    ]
                )
            for r in group:
                calls.append(
                    (
                        r.actor.hook_each.remote("load_state_dict", per_replica[0 if training else r.index]),
                        r,
                        "load_state_dict()",
                    )
                )
        wait_all(calls, Deadline(self.deadlines.start_s, "load_state_dict() on resume"))


@dataclass
class Measured:
    """Seconds spent per port and per device over the run, to set beside the plan's prediction."""

    port_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    device_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def add(self, port: str, device: str, seconds: float) -> None:
        self.port_s[port] += seconds
        self.device_s[device] += seconds


def _mean_of_dicts(items: list[Any]) -> dict[str, float]:
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for item in items:
        if isinstance(item, dict):
            for key, value in item.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    sums[key] += float(value)
                    counts[key] += 1
    return {key: sums[key] / counts[key] for key in sums}
