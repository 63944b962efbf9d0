"""The controller: the plan's program interpreted with Ray — one coarse call per worker per phase.

Bulk data (trajectories, weights) moves between workers as Ray object references; the driver never
touches it. Per-step loop data moves over the workers' own channels (see `loop.py`). What each phase
calls, in what order and how calls are split over replicas is `m2flow.program`'s, shared with the
planner's simulator; this module issues the calls, waits for them and records what they did.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from m2flow.dispatch import gather, split
from m2flow.graph import MacroGraph
from m2flow.overlap import Overlap
from m2flow.planners.render import ReplicaPort, beside_rendering
from m2flow.program import own_items, part_port, run_phase
from m2flow.runtime.asynchronous import Asynchronous
from m2flow.runtime.batches import Backlog, Call
from m2flow.runtime.deadlines import Deadlines
from m2flow.runtime.in_place import InPlace, Issued
from m2flow.runtime.iteration_metrics import IterationResult, Measured, check_accounting, mean_of_dicts, sum_of_dicts
from m2flow.runtime.launch import Launch
from m2flow.runtime.loop import LoopProgram, LoopStats
from m2flow.runtime.rank_naming import naming_ranks
from m2flow.runtime.replace import Replacer
from m2flow.runtime.replica import Replica
from m2flow.runtime.replica_waits import await_calls, await_loop
from m2flow.runtime.tracing import CONTROLLER, TaskEvent, Trace
from m2flow.runtime.waits import Deadline, settle, wait_all
from m2flow.runtime.weight_sync import TRANSPORTS, SyncTransport
from m2flow.schedule import Phase, Plan, ReplicaId
from m2flow.sharding import shard_groups
from m2flow.spec import Edge, PortRef


class Controller(Asynchronous, InPlace):
    """Runs iterations of the plan's program (the `m2flow.program.Interpreter` that executes)."""

    def __init__(
        self,
        graph: MacroGraph,
        plan: Plan,
        launch: Launch,
        trace: Trace,
        trace_until: int,
        replacer: Replacer,
    ):
        self.graph = graph
        self.plan = plan
        self.launch = launch
        self.trace = trace
        self.trace_until = trace_until  # iterations before this one trace every micro task
        self.deadlines = Deadlines.from_plan(plan, graph.spec.run.timeouts)
        self.beside_rendering = beside_rendering(graph, plan.placements, plan.pipeline_stages, plan.cluster)
        self.measured = Measured()
        self._it = 0
        self._result = IterationResult()
        self._calls: list[Call] = []  # issued in the current phase, awaited at its end
        self._phase_began = 0.0  # when the running phase began (wall clock): no call of it was submitted earlier
        self._items: dict[Any, float] = {}  # output or event reference -> env steps of the call (for the trace)
        self._producer: dict[Any, Replica] = {}  # output reference -> the replica whose output it is
        self._streamed: dict[PortRef, list[Any]] = {}  # then-sources produced while the loop ran
        self._stream_calls: list[Call] = []
        self._consumes: dict[Any, Any] = {}  # a streamed part call's event -> the output it was given
        self._given_up: list[Any] = []  # calls that failed with a replaced replica: their errors are taken
        self._issued: dict[Any, Issued] = {}  # this iteration's port calls by event, to issue again
        self.replacer = replacer  # what may be replaced in place
        # replicas replaced after the iteration's own calls (in its metrics() hook, at its checkpoint): the next
        # iteration warms up their processes
        self.fresh = False
        self.unmeasured: set[int] = set()  # iterations whose costs `measured` leaves out
        asynchronous = graph.spec.flow.asynchronous
        self.overlap = Overlap.of(asynchronous) if asynchronous is not None else None
        self.backlog = Backlog(self.overlap) if self.overlap is not None else None
        self._last = 0  # the last iteration of the current segment (no batch pending after it)

    def settle_given_up(self, timeout_s: float) -> None:
        """The calls given up with replaced replicas that are still queued: their errors taken as they end."""
        self._given_up = settle(self._given_up, timeout_s)

    def adopt(self, plan: Plan) -> None:
        """The same placement with a new prediction (measured costs): its deadlines follow."""
        self.plan = plan
        self.deadlines = Deadlines.from_plan(plan, self.graph.spec.run.timeouts)

    def iteration(self, it: int, last: int | None = None) -> IterationResult:
        """Run iteration `it`; `last` ends its segment (asynchronous flows: no batch pending after it)."""
        self._it, self._result, self._issued = it, IterationResult(), {}
        fresh, self.fresh = self.fresh, False
        pending = self.backlog.refs() if self.backlog is not None else set()
        self._items = {ref: items for ref, items in self._items.items() if ref in pending}
        self._producer = {ref: r for ref, r in self._producer.items() if ref in pending}
        if self.backlog is not None:  # a new controller (start, restart, resume) begins at `it`
            self.backlog.collected = max(self.backlog.collected, it)
        self._last = it if last is None else last
        before = self.measured.copy()
        start = time.time()
        dropping = self.overlap is not None and self.overlap.drops
        if dropping:
            self._poll_training()
        for phase in self.plan.phases:
            if self._runs(phase):
                self._run(phase)
        if dropping:
            self._catch_up() if it == self._last else self._poll_training()
        elif self.backlog is not None and self.backlog.training is not None:
            began = time.time()
            self._finish_training()
            self._add_time("time/train_wait_s", began)
        self._given_up = settle(self._given_up)  # not reported as unhandled; those still queued, next time
        result = self._result
        result.metrics.update(self._worker_metrics())
        ran_loop = self.graph.loop is None or "time/loop_s" in result.metrics
        if result.replacements or not ran_loop or fresh:  # a wait on a hung replica and a redo, an asynchronous
            self.measured = before  # segment's last update alone, new processes: not the iteration the plan predicts
            self.unmeasured.add(it)
        if self.measured.warming_up:  # the first iteration pays one-time costs (imports, lazy init, first calls)
            self.measured = Measured(warming_up=False, since=time.time())
        training = self.backlog.training if self.backlog is not None else None
        self.measured.settle(training.issued_at if training is not None else time.time())  # all else has returned
        elapsed = time.time() - start
        whole = TaskEvent("iteration", "iteration", start, start + elapsed)
        self.trace.task(CONTROLLER, CONTROLLER, whole, iteration=it)
        result.metrics["time/iteration_s"] = elapsed
        if result.env_steps:
            result.metrics["env/steps_per_s"] = result.env_steps / elapsed
        return result

    def _run(self, phase: Phase) -> None:
        began = self._phase_began = time.time()  # before any of the phase's calls is submitted
        run_phase(phase, self)
        self._add_time(f"time/{phase.op}_s", began)
        self.trace.task(CONTROLLER, CONTROLLER, TaskEvent(phase.op, "phase", began, time.time()), iteration=self._it)

    # -- the interpreter ---------------------------------------------------------------------------
    def swap(self, phase: Phase) -> None:
        """The context switches the plan puts before this phase: offloads first, then onloads."""
        began = time.time()
        for op, workers in (("offload", phase.offload), ("onload", phase.onload)):
            calls = [(r.actor.swap.remote(op), r, f"{op}()") for w in workers for r in self.launch.replicas[w]]
            self._record(wait_all(calls, self._deadline(f"{op} of {', '.join(workers)}", "swap")), calls)
        if phase.offload or phase.onload:
            self._add_time("time/swap_s", began)

    def call(self, port: PortRef, inputs: list[list[Any]], phase: Phase) -> list[Any]:
        info = self.graph.info[port.worker]
        rule = info.dispatch(port.port)
        per_edge = [split(rule, refs, info.replicas, info.data_parallel) for refs in inputs]
        outputs = []
        for r in self.launch.replicas[port.worker]:
            mine = [edge[r.index] for edge in per_edge]
            flat = [ref for refs in mine for ref in refs]
            items = (
                sum(self._items[ref] for ref in flat) if flat else own_items(self.graph, port.worker, r.index, phase.op)
            )
            outputs.append(self._call_replica(r, port.port, [len(refs) for refs in mine], flat, items, phase))
        return gather(rule, outputs)

    def copy_state(self, port: PortRef, state: Any, phase: Phase, targets: list[Replica] | None = None) -> None:
        """Every replica of `port`'s worker its dispatch sends a state to (`WorkerInfo.state_receivers`; or only
        those of `targets`) receives `state`."""
        edge, transport = self._sync_edge(phase)
        receivers = set(self.graph.info[port.worker].state_receivers(port.port))
        candidates = self.launch.replicas[port.worker] if targets is None else targets
        for r in [r for r in candidates if r.index in receivers]:
            _, event = r.actor.copy_state.options(num_returns=2).remote(str(edge), port.port, self._it, state)
            self._calls.append((event, r, f"sync {port}"))
        if transport.source_sends:  # e.g. a broadcast: it sends while they receive
            source = self.launch.replicas[edge.src.worker][0]
            sending = source.actor.send_state.remote(str(edge), edge.src.port, self._it)
            self._calls.append((sending, source, f"sync {edge} (send)"))

    def loop(self, phase: Phase) -> None:
        loop = self.graph.loop
        program = LoopProgram(
            ports=tuple((p.worker, p.port) for p in loop.ports),
            horizon=loop.horizon,
            stages=self.plan.pipeline_stages,
            shards=self.graph.workers[loop.entry.worker].count,
            replicas={w: self.graph.workers[w].count for w in loop.workers},
            iteration=self._it,
            channel_timeout_s=self.deadlines.channel_s,
            silence_s=self.deadlines.silence_s,
            trace_steps=self._it < self.trace_until,
            droppable=self.replacer.replaceable(),
            merge_slices=frozenset(j for j, p in enumerate(loop.ports) if str(p) in self.plan.merge_slices),
        )
        processes = self._loop_processes()
        steps_before = self._result.env_steps
        began = time.time()
        calls = [(group[0].process.run_loop.remote(program), group[0], "the loop") for group in processes]
        self._stream(phase)
        deadline = self._loop_deadline("the interaction loop", program.droppable)
        per_process, failed = await_loop(
            calls, processes, deadline, loop.entry.worker, program.droppable, self.deadlines.channel_s
        )
        self.measured.loop_s += time.time() - began
        finished = {i for i, stats in enumerate(per_process) if stats is not None}
        for i, dropped in self._await_handover(processes, finished, program.droppable).items():
            per_process[i], failed[i] = None, dropped  # its steps are lost with its output: redone
        sent = 0
        for group, by_worker in zip(processes, per_process, strict=True):
            for r in group if by_worker is not None else []:
                sent += self._record_loop(r, by_worker[r.worker], program)
        if failed:
            sent += self._replace([(r, failed[i]) for i in failed for r in processes[i]], program, phase)
        self._result.metrics["loop/bytes_sent"] = self._result.metrics.get("loop/bytes_sent", 0.0) + sent
        if self.overlap is not None:
            self._collect(self._result.env_steps - steps_before)

    def _collect(self, env_steps: int) -> None:
        """An asynchronous flow's batch: the loop workers' after-loop ports, called before their next loop."""
        then = self._then_phase()
        loop_workers = set(self.graph.loop.workers)
        sources = [port for port in self.graph.then_order if port.worker in loop_workers]
        self.backlog.add(self._it, {port: self.call(port, [], then) for port in sources}, env_steps)

    def _loop_processes(self, shards: set[int] | None = None) -> list[list[Replica]]:
        """The loop's processes, each with the replicas it hosts (only those serving `shards`, if given)."""
        loop = self.graph.loop
        n_shards = self.graph.workers[loop.entry.worker].count
        processes: dict[int, list[Replica]] = {}
        for r in (r for w in loop.workers for r in self.launch.replicas[w]):
            serves = set(shard_groups(n_shards, self.graph.workers[r.worker].count)[r.index])
            if shards is None or serves & shards:
                processes.setdefault(id(r.process), []).append(r)
        return list(processes.values())

    def streamed(self, phase: Phase) -> dict[PortRef, list[Any]]:
        if phase.overlaps:  # the oldest batch collected, which this iteration trains
            return dict(self.backlog.batches[0].produced)
        produced, self._streamed = self._streamed, {}
        self._calls += self._stream_calls
        self._stream_calls, self._consumes = [], {}
        return produced

    def end_phase(self, phase: Phase, produced: dict[PortRef, list[Any]]) -> None:
        calls, self._calls = self._calls, []
        if phase.overlaps:  # awaited after the loop it runs beside
            what = f"training on the batch the loop of iteration {self.backlog.batches[0].collected_at} collected"
            self.backlog.issue(calls, produced, self._deadline(what, "then"), self._phase_began)
            return
        if phase.op == "then":
            events, calls = self._await_then(phase, calls, produced)
            self._issued = {}
        elif phase.op == "sync":
            events, calls = self._await_sync(phase, calls)
        else:
            with naming_ranks(self.launch):
                events = wait_all(calls, self._deadline(f"the {phase.op} phase", phase.op))
        self._record(events, calls)
        # the state's size (none seen: its copies failed)
        if phase.op == "sync" and (size := max((e.bytes for e in events), default=0)):
            self._result.metrics["sync/bytes"] = float(size)
        if phase.op == "then":
            self._then_metrics(produced, self._result.env_steps)

    # -- helpers -----------------------------------------------------------------------------------
    def _sync_edge(self, phase: Phase) -> tuple[Edge, type[SyncTransport]]:
        """A sync phase's edge and the transport the plan gave it."""
        (edge,) = phase.edges
        return edge, TRANSPORTS[self.launch.transports[edge]]

    def _call_replica(
        self, r: Replica, port: str, counts: list[int], refs: list[Any], items: float, phase: Phase
    ) -> Any:
        """Call `port` on one replica; its output and its event count the env steps it works on. A sync
        edge's source publishes its output by the edge's transport."""
        if phase.op == "sync":
            edge, _ = self._sync_edge(phase)
            out, event = r.actor.publish_state.options(num_returns=2).remote(str(edge), port, self._it)
        else:
            out, event = r.actor.call.options(num_returns=2).remote(port, self._it, counts, *refs)
            if r.worker in self.replacer.groups:  # it may be restarted and called again
                self._issued[event] = Issued(port, counts, list(refs), items, out)
        self._calls.append((event, r, f"port {r.worker}.{port}"))
        self._producer[out] = r
        self._items[out] = self._items[event] = items
        return out

    def _stream(self, loop_phase: Phase, only: set[ReplicaId] | None = None) -> None:
        """Streamed then-edges, submitted with the loop: each loop replica's output port is queued behind
        its own loop, and its part goes to the destination replicas that own it (`<port>_part`) as soon
        as it exists, while other replicas still step. The then-phase waits for these calls (the loop already
        waited for the outputs of replicas it may replace: `_await_handover`). `only`: the parts of these
        replicas' outputs (replacements), the rest already sent."""
        then = self._then_phase()
        for edge in then.streamed if then is not None else []:
            if edge.src not in self._streamed:
                self._streamed[edge.src] = self.call(edge.src, [], then)
            info = self.graph.info[edge.dst.worker]
            rule = info.dispatch(edge.dst.port)
            shares = split(rule, self._streamed[edge.src], info.replicas, info.data_parallel)
            for r in self.launch.replicas[edge.dst.worker]:
                for ref in shares[r.index]:
                    if only is None or self._producer[ref].id in only:
                        self._call_replica(r, part_port(edge).port, [1], [ref], self._items[ref], then)
                        self._consumes[self._calls[-1][0]] = ref  # the part call's event
        self._stream_calls += self._calls
        self._calls = []

    def _then_phase(self) -> Phase | None:
        return next((p for p in self.plan.phases if p.op == "then"), None)

    def _record_loop(self, r: Replica, stats: LoopStats, program: LoopProgram) -> int:
        """Trace a replica's loop tasks (or one bar when not traced in detail); returns the bytes it sent."""
        busy = self.measured.loop_busy_s.setdefault(r.id, defaultdict(float))
        for port, seconds in stats.seconds.items():
            self.measured.add(f"{r.worker}.{port}", seconds)
            busy[port] += seconds
        self.measured.busy(r.device).update(stats.spans)
        for event in stats.events:  # a call beside rendering says so: its cost is fitted apart (planners/render.py)
            beside = {"beside_rendering": True} if ReplicaPort(r.id, event.name) in self.beside_rendering else {}
            self.trace.task(str(r.id), r.device, event, iteration=self._it, **beside)
        if not program.trace_steps and stats.seconds:
            busy = sum(stats.seconds.values())
            event = TaskEvent(
                "loop (busy)",
                "loop",
                stats.start,
                stats.start + busy,
                items=sum(stats.items.values()),
                bytes=stats.sent_bytes,
            )
            self.trace.task(str(r.id), r.device, event, iteration=self._it)
        last = self.graph.loop.ports[-1]
        if r.worker == last.worker:
            self._result.env_steps += stats.items.get(last.port, 0)
        return stats.sent_bytes

    def _then_metrics(self, produced: dict[PortRef, list[Any]], env_steps: int) -> None:
        """Terminal after-loop ports' outputs are the iteration's metrics; then the step accounting against
        the `env_steps` of the loop that collected the batch."""
        sources = {e.src for e in self.graph.then}
        for port in (p for p in self.graph.then_order if p not in sources):
            calls = [(ref, self._producer[ref], str(port)) for ref in produced[port]]
            outputs = wait_all(calls, self._deadline(str(port), "then"))
            items = [item for per_replica in outputs for item in per_replica]
            self._result.metrics.update(mean_of_dicts(items))
            rule = self.graph.info[port.worker].dispatch(port.port)
            if (rule.split, rule.gather) == ("shard", "all"):  # each replica reports its own share: they add up
                self._result.metrics.update(sum_of_dicts(items, "/steps_consumed"))
        if self.graph.loop is not None:
            check_accounting(self._it, env_steps, self._result.metrics)

    def _record(self, events: list[TaskEvent], calls: list[Call]) -> None:
        for event, (ref, r, _) in zip(events, calls, strict=True):
            if event.phase == "call":  # a port call counts the env steps it received, the cost model's unit
                event = event._replace(items=int(self._items.get(ref, event.items)))
            self.trace.task(str(r.id), r.device, event, iteration=self._it)
            self.measured.add(f"{r.worker}.{event.name}", event.seconds)
            self.measured.busy(r.device).add(event.start, event.end)

    def _add_time(self, key: str, began: float) -> None:
        metrics = self._result.metrics
        metrics[key] = metrics.get(key, 0.0) + time.time() - began

    def _loop_deadline(self, what: str, droppable: frozenset[ReplicaId]) -> Deadline:
        """The loop's deadline: peers may first wait out each droppable simulator replica that hangs, and
        then a droppable inference replica that hangs (as long as its simulators wait for it)."""
        simulators = sum(1 for r in droppable if r.worker == self.graph.loop.entry.worker)
        waits = simulators + (1 + simulators if len(droppable) > simulators else 0)
        waiting = self.deadlines.phase("loop") + waits * self.deadlines.channel_s
        naming = self.launch.processes.watch(self.launch.timeouts.silence_s)
        return Deadline(waiting, f"{what} (iteration {self._it}); {self.deadlines.explain}", naming=naming)

    def _deadline(self, what: str, phase: str, seconds: float | None = None) -> Deadline:
        """A phase's deadline (`seconds`, else its op's); a process on this host silent for
        `run.timeouts.silence_s` is hung before it."""
        watch = self.launch.processes.watch(self.launch.timeouts.silence_s)
        seconds = self.deadlines.phase(phase) if seconds is None else seconds
        return Deadline(seconds, f"{what} (iteration {self._it}); {self.deadlines.explain}", watch)

    def _worker_metrics(self) -> dict[str, float]:
        """Average of what each replica's optional `metrics()` hook reports; a replica still training (drop
        mode, across loops) is asked next time, not waited for."""
        busy = self.backlog.busy() if self.backlog is not None else set()
        replicas = [r for group in self.launch.replicas.values() for r in group if id(r) not in busy]
        calls = [(r.actor.hook.remote("metrics"), r, "metrics()") for r in replicas]
        deadline = self._deadline("metrics() hooks", "then")
        replaceable = self.replacer.replaceable()
        per_replica, failed = await_calls(calls, deadline, replaceable)
        if failed:
            self._replace_outside_loop([(calls[i][1], dropped) for i, dropped in failed.items()])
            self.fresh = True
        return mean_of_dicts([m for values in per_replica if values for m in values])
