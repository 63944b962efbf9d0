"""Run a workflow: plan it, start it on Ray, iterate, report, checkpoint, and trace."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from m2flow.config import dump_spec
from m2flow.graph import build_graph
from m2flow.planners import load_measured, make_plan
from m2flow.runtime.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from m2flow.runtime.controller import Controller
from m2flow.runtime.launch import Launch, connect_ray
from m2flow.runtime.replan import replan
from m2flow.runtime.reporting import Reporter
from m2flow.runtime.tracing import Trace
from m2flow.schedule import Plan
from m2flow.spec import WorkflowSpec
from m2flow.viz.tables import comparison_table

log = logging.getLogger(__name__)

REPLAN_AFTER = 2  # iterations traced before re-planning: the first warms up, the second is measured


@dataclass
class RunResult:
    run_dir: Path
    plan: Plan
    iterations: int
    history: list[dict] = field(default_factory=list)

    @property
    def last(self) -> dict:
        return self.history[-1] if self.history else {}


def execute(spec: WorkflowSpec, source: str | None = None) -> RunResult:
    graph = build_graph(spec, source)
    cluster = connect_ray(spec.cluster)
    plan = make_plan(graph, cluster)
    run_dir = Path(spec.run.output_dir) / spec.name
    if not spec.run.resume:
        keep_previous(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "workflow.yaml").write_text(dump_spec(spec))
    plan.save(run_dir / "plan.json")

    start, env_steps, restored = 0, 0, None
    checkpoint = latest_checkpoint(run_dir / "checkpoints") if spec.run.resume else None
    if checkpoint is not None:
        restored, meta = load_checkpoint(checkpoint)
        start, env_steps = meta["iteration"] + 1, meta["env_steps"]

    result = RunResult(run_dir, plan, start)
    trace = Trace(plan)
    reporter = Reporter(run_dir, spec.run.iterations, start, spec.run.progress)
    reporter.print(f"m2flow: {spec.name}: {plan.mode} placement, {plan.pipeline_stages} stage(s); outputs in {run_dir}")
    if checkpoint is not None:
        reporter.print(f"m2flow: resumed from {checkpoint} at iteration {start}")
    replan_at = start + REPLAN_AFTER if spec.placement.replan else None
    launch = None
    try:
        trace_until = start + max(spec.run.trace_detail_iterations, REPLAN_AFTER if spec.placement.replan else 0)
        launch, controller = _start(graph, plan, run_dir, trace, restored, trace_until)
        since = start
        for it in range(start, spec.run.iterations):
            if it == replan_at:
                better, why = replan(graph, cluster, plan, trace.events, load_measured(spec))
                reporter.print(why)
                if better is not None:
                    plan.save(run_dir / "plan.initial.json")
                    state = controller.state_dict()
                    launch.close()
                    plan = result.plan = better
                    plan.notes.append(why)
                    plan.save(run_dir / "plan.json")
                    launch, controller = _start(graph, plan, run_dir, trace, state, trace_until)
                    since = it
            began = time.time()
            outcome = controller.iteration(it)
            env_steps += outcome.env_steps
            metrics = {**outcome.metrics, "time/iteration_s": time.time() - began}
            reporter.log(it, env_steps, metrics)
            result.history.append({"iteration": it, "env_steps": env_steps, **metrics})
            result.iterations = it + 1
            every = spec.run.checkpoint_every
            if (every and (it + 1) % every == 0) or it + 1 == spec.run.iterations:
                save_checkpoint(
                    run_dir / "checkpoints",
                    it,
                    controller.state_dict(),
                    {"env_steps": env_steps, "workflow": spec.name, "plan": plan.to_dict()},
                )
        ran = [h for h in result.history if h["iteration"] >= since]
        if ran:
            iteration_s = sum(h["time/iteration_s"] for h in ran) / len(ran)
            reporter.print(
                comparison_table(plan, controller.measured.port_s, controller.measured.device_s, len(ran), iteration_s)
            )
    finally:
        trace.write(run_dir / "trace.json")
        reporter.close()
        if launch is not None:
            launch.close()
    return result


def _start(
    graph, plan: Plan, run_dir: Path, trace: Trace, state: dict | None, trace_until: int
) -> tuple[Launch, Controller]:
    """Actors and channels for `plan`, with worker state restored if given."""
    launch = Launch(graph, plan, str(run_dir))
    try:
        launch.start()
        controller = Controller(graph, plan, launch, trace, trace_until)
        if state is not None:
            controller.load_state_dict(state)
    except BaseException:
        launch.close()
        raise
    return launch, controller


def keep_previous(run_dir: Path) -> None:
    """A fresh run never overwrites an earlier one: its folder is renamed aside, with a timestamp."""
    if run_dir.exists() and any(run_dir.iterdir()):
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(run_dir.stat().st_mtime))
        aside = run_dir.with_name(f"{run_dir.name}.{stamp}")
        suffix = 1
        while aside.exists():
            aside = run_dir.with_name(f"{run_dir.name}.{stamp}-{suffix}")
            suffix += 1
        run_dir.rename(aside)
        log.warning("kept the previous run of %s in %s", run_dir.name, aside)
