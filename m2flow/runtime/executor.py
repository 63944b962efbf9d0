"""Run a workflow: plan it, start it on Ray, iterate, report, checkpoint, trace — and recover.

A worker that raises, dies or hangs ends the iteration with an error naming it. With
`run.on_failure: restart` the run recreates every worker, restores the last checkpoint and goes on
from the iteration after it, at most `run.max_restarts` times; past that it stops with the history
of its failures. With `run.on_failure: replace` a simulator or inference replica that fails is replaced
in place instead (the controller redoes the unfinished part of the loop), and a training worker whose rank
fails while it trains is restarted alone on the same batch (`m2flow.runtime.in_place`); any other failure
restarts.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from pathlib import Path

from m2flow.config import apply_overrides, dump_spec, spec_from_dict
from m2flow.durable import output_folder
from m2flow.errors import M2FlowError, PlanError, WaitTimeout, WorkerError
from m2flow.graph import MacroGraph, build_graph
from m2flow.planners import make_plan
from m2flow.planners.cache import CachedFit, new_run
from m2flow.planners.run_level import RunTotals
from m2flow.runtime.checkpoint import latest_checkpoint, read_meta
from m2flow.runtime.controller import Controller
from m2flow.runtime.crashes import crashes_of
from m2flow.runtime.deadlines import Deadlines
from m2flow.runtime.host import headline
from m2flow.runtime.launch import Launch
from m2flow.runtime.nodes import addresses, driver_node, unreachable
from m2flow.runtime.quarantine import Quarantine
from m2flow.runtime.ray_cluster import cluster_from_ray, connect_ray
from m2flow.runtime.replace import Replacer, Restore, candidates, training_groups
from m2flow.runtime.replan import (
    REPLAN_AFTER,
    TRIAL_LEFT,
    Running,
    calibration,
    remember,
    remember_beside,
    replan,
    with_phases_of,
)
from m2flow.runtime.reporting import Reporter
from m2flow.runtime.resume import resume_failure
from m2flow.runtime.run_log import RunLog
from m2flow.runtime.run_record import RunResult, failure_entry, keep_previous
from m2flow.runtime.run_report import measured_iterations, report_run
from m2flow.runtime.snapshots import Replacing, Snapshots
from m2flow.runtime.tracing import Trace
from m2flow.schedule import Plan
from m2flow.spec import WorkflowSpec
from m2flow.viz.tables import cached_costs_table

log = logging.getLogger(__name__)

RECOVERABLE = (WorkerError, WaitTimeout)
SETTLE_S = 2.0  # how long a closing run waits for the given-up calls still queued to end


def planned_graph(spec: WorkflowSpec, plan: Plan, source: str | None = None) -> MacroGraph:
    """The graph `plan` runs: the workflow's, with the knobs the planner chose (simulator processes x envs)."""
    return build_graph(spec_from_dict(apply_overrides(spec.to_dict(), plan.spec_overrides, "plan")), source)


def execute(spec: WorkflowSpec, source: str | None = None) -> RunResult:
    graph = build_graph(spec, source)
    output_folder(spec.run.output_dir, "run.output_dir")  # before the cluster starts, not after
    cluster = connect_ray(spec.cluster)
    plan = make_plan(graph, cluster)
    if plan.spec_overrides:  # run exactly what the planner chose
        graph = planned_graph(spec, plan, source)
    run = Run(graph, cluster, plan)
    try:
        run.start()
        while run.next_iteration < spec.run.iterations:
            try:
                run.iterate()
            except RECOVERABLE as exc:
                run.recover(exc)
        run.finish()
    finally:
        run.shutdown()
    return run.result


class Run:
    """One run's state: the plan, the live workers, the iteration, the outputs."""

    def __init__(self, graph: MacroGraph, cluster, plan: Plan):
        spec = graph.spec
        self.graph, self.spec, self.cluster, self.plan = graph, spec, cluster, plan
        self.run_dir = Path(spec.run.output_dir) / spec.name
        if not spec.run.resume:
            keep_previous(self.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.next_iteration, self.env_steps, self.restore_from = self._latest() if spec.run.resume else (0, 0, None)
        self.recorded = False  # a resumed run's record (workflow.yaml, plan.json) is the old one until it restored
        if self.restore_from is None:
            self._record()
        self.result = RunResult(self.run_dir, plan, self.next_iteration)
        self.trace = Trace(plan)
        self.reporter = Reporter(
            self.run_dir, spec.run.iterations, self.next_iteration, spec.run.progress, self.env_steps
        )
        self.run_log = RunLog(self.result, self.reporter)
        unknown = plan.predicted.unknown_costs
        self.overlapped = spec.flow.asynchronous is not None  # its costs are measured under contention
        measuring = calibration(graph, unknown, spec.run.iterations - self.next_iteration)
        self.twin = measuring.twin  # an asynchronous flow measures on its synchronous twin until the re-plan
        self.replans_left = measuring.replans
        self.replanned = False
        detail = max(spec.run.trace_detail_iterations, REPLAN_AFTER if measuring.replans else 0)
        self.trace_until = self.next_iteration + detail
        self.replan_at = self.next_iteration + REPLAN_AFTER if measuring.replans else None
        self.measured_since = self.next_iteration  # the first iteration the current workers ran
        self.warmups: list[int] = []  # the first iteration of every start of the workers: left out of the costs
        self.tried_from: Plan | None = None  # the plan a re-plan's trial left (`replan`), while it runs
        self.cache_run = new_run()  # what this run saves to the cost cache, at a re-plan and at the end, counts once
        if self.next_iteration:
            self.reporter.print(f"m2flow: resuming after the checkpoint of iteration {self.next_iteration - 1}")
        elif spec.run.resume:
            self.reporter.print(
                f"m2flow: run.resume: no checkpoint in {self.run_dir / 'checkpoints'}; starting from iteration 0 there"
            )
        for line in measuring.says:
            self.reporter.print(line)
        quarantined = read_meta(self.restore_from).get("quarantined", {}) if self.restore_from else {}
        # kept across restarts and resumes: a quarantined env keeps its new seed
        self.quarantine = Quarantine(spec.run.quarantine_after, times={int(e): n for e, n in quarantined.items()})
        self.launch: Launch | None = None
        self.controller: Controller | None = None
        self.snapshots: Snapshots | None = None

    def _latest(self) -> tuple[int, int, Path | None]:
        """Where to go on from: the iteration after the last checkpoint, its env steps, the checkpoint."""
        checkpoint = latest_checkpoint(self.run_dir / "checkpoints")
        if checkpoint is None:
            return 0, 0, None
        meta = read_meta(checkpoint)
        return meta["iteration"] + 1, meta["env_steps"], checkpoint

    def start(self) -> None:
        self.reporter.print(
            f"m2flow: {self.spec.name}: {self.plan.mode} placement, {self.plan.pipeline_stages}"
            f" stage(s); outputs in {self.run_dir}"
        )
        self.launch = Launch(self.graph, self.plan, str(self.run_dir), self.quarantine.times)
        self.launch.start()
        if self.recorded:  # a resumed run's, once its checkpoint loaded: a resume that fails leaves the old one
            self.run_log.processes(self.launch)
        self.snapshots = Snapshots(self.graph, self.launch)
        replacer = self._replacer()
        if self.spec.run.spares:
            self.launch.stand_by(replacer.standing())
        graph, plan = (self.twin, with_phases_of(self.plan, self.twin)) if self.twin else (self.graph, self.plan)
        self.controller = Controller(graph, plan, self.launch, self.trace, self.trace_until, replacer)
        self.measured_since = self.next_iteration
        self.warmups.append(self.next_iteration)
        self.trace.started(plan, self.next_iteration)
        if self.restore_from is not None:
            log.info("restoring %s", self.restore_from)
            try:
                self.snapshots.restore(self.restore_from)
            except M2FlowError as exc:
                if self.recorded:  # a restart within this run: its own settings
                    raise
                planned = frozenset(override.partition("=")[0] for override in self.plan.spec_overrides)
                record = self.run_dir / "workflow.yaml"
                raise resume_failure(self.restore_from, exc, record, self.spec, planned) from None
            self.restore_from = None
        if not self.recorded:
            self._record()
            self.run_log.processes(self.launch)

    def _record(self) -> None:
        """The settings and plan this run runs, beside its outputs (`m2flow eval`, `export` and a resume read them)."""
        (self.run_dir / "workflow.yaml").write_text(dump_spec(self.spec))
        self.plan.save(self.run_dir / "plan.json")
        self.recorded = True

    def _replacer(self) -> Replacer:
        """What may be replaced in place (`run.on_failure: replace`: loop replicas and training workers; the
        run says which may not), within what is left of the run's budget."""
        replicas, why_not = candidates(self.graph) if self.graph.loop is not None else ([], [])
        groups, also_not = training_groups(self.graph, self.launch)
        budget = 0
        if self.spec.run.on_failure == "replace":
            budget = self.spec.run.max_replacements - sum(1 for f in self.result.failures if f["replaced"])
            why_not += also_not + list(filter(None, (self.launch.replaceable(replica) for replica in replicas)))
            for why in why_not:
                self.reporter.print(f"m2flow: run.on_failure: replace: {why}, so a failure of it restarts")
        restore = Restore(self._restore, self._checkpoint_before, self.snapshots.restore_workers)
        replaced = partial(self.run_log.replaced, launch=self.launch)
        return Replacer(self.launch, replicas, groups, budget, restore, self.quarantine, replaced)

    def iterate(self) -> None:
        it = self.next_iteration
        if it == self.replan_at:
            self._replan()
        began = time.time()
        outcome = self.controller.iteration(it, self._segment_end(it))
        self.env_steps += outcome.env_steps
        metrics = {**outcome.metrics, "time/iteration_s": time.time() - began}
        self.result.iterations = self.next_iteration = it + 1
        every = self.spec.run.checkpoint_every
        if (every and (it + 1) % every == 0) or it + 1 == self.spec.run.iterations:
            self._checkpoint()  # a loop replica lost meanwhile is replaced: one of `outcome.replacements`
        if self.controller.fresh:  # replaced after its last call: the next iteration warms up their processes
            self.warmups.append(self.next_iteration)
        if outcome.replacements:
            metrics["failures/replaced"] = float(len(outcome.replacements))
            metrics["failures/steps_redone"] = float(sum(r.steps_redone for r in outcome.replacements))
            metrics["failures/quarantined"] = float(sum(r.quarantined for r in outcome.replacements))
            more = self.next_iteration < self.spec.run.iterations
            if more and self.controller.replacer.budget > 0:  # the spares used, started again after the redo
                self.launch.spares.refill()
        self.reporter.log(it, self.env_steps, metrics)
        self.result.history.append({"iteration": it, "env_steps": self.env_steps, **metrics})

    def _segment_end(self, it: int) -> int:
        """The last iteration before the next checkpoint (a re-plan writes one, as does the run's end):
        an asynchronous flow's training has caught up with its loop by then."""
        ends = [self.spec.run.iterations - 1]
        every = self.spec.run.checkpoint_every
        if every:
            ends.append((it // every + 1) * every - 1)
        if self.replan_at is not None and self.replan_at > it:
            ends.append(self.replan_at - 1)
        return min(ends)

    def _restore(self, replica, envs_anew: bool) -> str:
        """A replacement's state: a simulator's envs as `run.replacement_state` asks (`envs_anew`: reset, an env
        being quarantined), yet with what it learned of them (observation statistics) when they reset; any
        other replica's state from the last checkpoint (an inference replica's noise streams, say); says what
        it was."""
        checkpoint = latest_checkpoint(self.run_dir / "checkpoints")
        simulator = replica.worker == self.graph.loop.entry.worker
        if checkpoint is None:
            return "its envs reset" if simulator else "its state as built"
        if simulator and (envs_anew or self.spec.run.replacement_state == "reset"):
            kept = self.snapshots.restore_statistics(checkpoint, replica)
            return f"its envs reset{f', their statistics from {checkpoint.name}' if kept else ''}"
        self.snapshots.restore_replica(checkpoint, replica)
        return f"its {'envs' if simulator else 'state'} restored from {checkpoint.name}"

    def _checkpoint_before(self, iteration: int) -> Path | None:
        """The last checkpoint if it was written right before `iteration` (it holds every worker's state as
        that iteration began); None otherwise."""
        checkpoint = latest_checkpoint(self.run_dir / "checkpoints")
        return checkpoint if checkpoint is not None and read_meta(checkpoint)["iteration"] == iteration - 1 else None

    def _checkpoint(self, replace_lost: bool = True) -> Path:
        """A checkpoint of the last finished iteration; a loop replica lost as it is written is replaced in
        place where it may be (`replace_lost`), else the failure is the run's."""
        meta = {
            "env_steps": self.env_steps,
            "workflow": self.spec.name,
            "plan": self.plan.to_dict(),
            "quarantined": self.quarantine.times,  # env -> times: how far its seed moved
        }
        replacing = Replacing(self.controller.replacer.replaceable, self.controller.replace_lost_in_checkpoint)
        root = self.run_dir / "checkpoints"
        return self.snapshots.save(root, self.next_iteration - 1, meta, replacing if replace_lost else None)

    def recover(self, exc: Exception) -> None:
        """Restart every worker from the last checkpoint, or re-raise with the failure history. A process
        that died of a crash says how (faulthandler's stacks are in the run's folder, not the worker's log)."""
        detected_at = time.time()
        said = self._crashes_beside(exc)
        failure = failure_entry(self.next_iteration, f"{headline(exc)}; {said}" if said else headline(exc), detected_at)
        self.run_log.failure(failure)
        restarts = sum(1 for f in self.result.failures if not f["replaced"])
        if self.spec.run.on_failure == "stop" or restarts > self.spec.run.max_restarts:
            if restarts > 1:
                history = "\n".join(
                    f"  - iteration {f['iteration']}: {f['error']}"
                    + (f" (replaced {f['replaced']} in place)" if f["replaced"] else "")
                    for f in self.result.failures
                )
                raise WorkerError(
                    f"stopping after {restarts - 1} restart(s) (run.max_restarts="
                    f"{self.spec.run.max_restarts}); failures:\n{history}\nlast: {exc}"
                ) from None
            if said and isinstance(exc, WaitTimeout):
                raise exc.detailed(f"({said})") from None
            if said:
                raise WorkerError(f"{exc}\n{said}") from None
            raise exc
        self.reporter.print(f"m2flow: iteration {failure['iteration']} failed: {failure['error']}")
        found_lost = self.launch.relocator.lost_ids() if self.launch is not None else frozenset()
        self.close()
        self._leave_lost_nodes(found_lost)
        self.next_iteration, self.env_steps, self.restore_from = self._latest()
        self.result.history = [h for h in self.result.history if h["iteration"] < self.next_iteration]
        self.reporter.rewind(self.next_iteration, self.env_steps)
        self.reporter.print(
            f"m2flow: restart {restarts}/{self.spec.run.max_restarts}: all workers recreated,"
            f" continuing at iteration {self.next_iteration}"
        )
        self.start()

    def _crashes_beside(self, exc: Exception) -> str:
        """How the processes that crashed of their own crashed, where `exc` does not say it already; the
        question is a courtesy: "" where it cannot be answered."""
        try:
            launch = self.launch
            crashes = crashes_of(launch.processes.of, launch.output_dir, launch.processes.of) if launch else {}
        except Exception:  # noqa: BLE001 - never worse than the failure itself
            return ""
        return "; ".join(f"{r}: {crash}" for r, crash in crashes.items() if str(crash.dump) not in str(exc))

    def _leave_lost_nodes(self, found_lost: frozenset[str]) -> None:
        """Probe the plan's nodes but those the launch already found lost; without the ones that are gone or
        cut off, re-plan on those left (the same workers and replicas: the checkpoint restores onto the new
        placement)."""
        planned = self.plan.cluster.node_ids
        if len(planned) < 2:
            return
        asked = tuple(node for node in planned if node not in found_lost and node != driver_node())
        lost = found_lost | unreachable(asked, Deadlines.from_plan(self.plan, self.spec.run.timeouts).reach_s)
        if not lost:
            return
        ips = addresses()
        names = ", ".join(ips.get(node, node) for node in sorted(lost))
        cluster = cluster_from_ray(self.spec.cluster, without=frozenset(lost))
        try:
            plan = make_plan(self.graph, cluster)
        except PlanError as exc:
            raise PlanError(f"lost node(s) at {names}, and the nodes left cannot run this workflow: {exc}") from None
        if plan.spec_overrides and plan.spec_overrides != self.plan.spec_overrides:  # knobs the graph fixed: none
            raise PlanError(
                f"lost node(s) at {names}; the plan for the nodes left changes the workers' own knobs"
                f" ({plan.spec_overrides}), which a checkpoint cannot carry over: run again on them"
            )
        self.cluster, self.plan = cluster, plan
        self.result.plan = plan
        self.tried_from = None  # a trial's plan is gone with the node: the plan it left no longer applies either
        plan.save(self.run_dir / "plan.json")
        self.reporter.print(
            f"m2flow: lost node(s) at {names}: re-planned on the {cluster.nodes} node(s) left"
            f" ({plan.mode}, {plan.pipeline_stages} stage(s))"
        )

    def _replan(self) -> None:
        self.replans_left -= 1
        self.replanned = True
        self.replan_at = None
        twin, self.twin = self.twin, None  # an asynchronous flow runs as declared from here
        running = self._running(self.controller.plan)
        may_try = self.replans_left > 0 and self.spec.run.iterations - self.next_iteration >= TRIAL_LEFT
        decision = replan(self.graph, self.cluster, running, self.trace.events, measured_on=twin, may_try=may_try)
        remember(self.graph, self.cluster, self.trace.events, running, measured_on=twin, run=self.cache_run)
        self.tried_from = running.plan if decision.trial else None
        self.reporter.print(decision.why)
        if not (self.run_dir / "plan.initial.json").exists():
            self.plan.save(self.run_dir / "plan.initial.json")
        decision.plan.notes.append(decision.why)
        decision.plan.save(self.run_dir / "plan.json")
        if not decision.switched and twin is not None:  # the same workers, now run asynchronously
            self.plan = self.result.plan = decision.plan
            self.controller.settle_given_up(SETTLE_S)
            self.controller = Controller(
                self.graph, self.plan, self.launch, self.trace, self.trace_until, self.controller.replacer
            )
            self.measured_since = self.next_iteration
            return
        if not decision.switched:  # the same plan, its prediction now from the measured costs
            self.plan = self.result.plan = decision.plan
            self.controller.adopt(decision.plan)
            return
        # the workers restart under the new plan from here; a replica lost as it is written restarts the run (the
        # switch recreates every worker anyway: a replacement would be spent on a process about to close)
        self.restore_from = self._checkpoint(replace_lost=False)
        self.close()
        self.plan = self.result.plan = decision.plan
        if self.replans_left:  # the new plan runs other batch sizes: measure them too
            self.replan_at = self.next_iteration + REPLAN_AFTER
            self.trace_until = max(self.trace_until, self.replan_at)
        self.start()

    def _running(self, plan: Plan) -> Running:
        return Running(plan, self.measured_since, tuple(self.warmups), self.tried_from)

    def finish(self) -> None:
        ran = [
            h
            for h in measured_iterations(self.result.history, self.measured_since, self.graph.loop is not None)
            if h["iteration"] not in self.controller.unmeasured  # replacements: their costs are not in `measured`
        ]
        cached: dict[str, CachedFit] = {}  # what the cache holds of the ports this run measured
        if self.overlapped:
            self.reporter.print(
                "m2flow: flow.async: the costs measured beside training are not cached (those of the synchronous"
                " first iterations are, when it measured costs)"
            )
            iterations_s = [h["time/iteration_s"] for h in ran]
            said = remember_beside(self.graph, self.cluster, self.plan, iterations_s, self.cache_run)
            if said:
                self.reporter.print(said)
        else:
            totals = RunTotals(dict(self.controller.measured.port_s), frozenset(h["iteration"] for h in ran))
            running = self._running(self.plan)
            cached = remember(self.graph, self.cluster, self.trace.events, running, run=self.cache_run, totals=totals)
        if ran:
            measured, events = self.controller.measured, self.trace.events
            report = report_run(self.plan, measured, events, ran, self.replanned, self.reporter)
            report.save(self.run_dir / "report.json")
            self.result.report = report
            self.result.device_busy = report.measured_busy()
        if cached:
            self.reporter.print(cached_costs_table(cached))

    def close(self) -> None:
        """Stop the workers (the run's outputs stay); safe to call more than once. A resume that failed before its
        checkpoint loaded leaves the trace of the run it went on from."""
        if self.recorded:
            self.trace.write(self.run_dir / "trace.json")
        if self.controller is not None:
            self.controller.settle_given_up(SETTLE_S)
        if self.launch is not None:
            self.launch.close()
            self.launch = None

    def shutdown(self) -> None:
        self.close()
        self.reporter.close()
