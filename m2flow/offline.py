"""What m2flow does with a finished run, in this process, with the workflow's own workers and the runtime's
worker protocol (no cluster):

- `m2flow eval RUN_DIR`: deterministic episodes of the latest checkpoint. The training worker restores its
  checkpoint and gives its weights (its port on the sync edge into the loop's policy); the simulator
  restores its state (the observation statistics it normalises with) and plays `evaluate(weights)` episodes
  on fresh seeds. It needs a simulator with an `evaluate` port (`GymEnv`, `CameraEnv`); the policy is the
  inference worker's args unless the simulator declares its own `evaluation`.
- `m2flow export RUN_DIR --to FOLDER`: the training worker restores its checkpoint and writes its policy
  with its `export(folder)` hook (PPO over `model: hf`: a transformers checkpoint that loads again).
"""

from __future__ import annotations

import copy
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from m2flow.config import load_spec
from m2flow.context import WorkerContext, set_context
from m2flow.errors import SpecError
from m2flow.graph import MacroGraph, build_graph

EVALUATION_SEED = 10_000  # evaluation episodes start from seeds the training envs never used


@dataclass
class Evaluation:
    checkpoint: Path
    episodes: int
    metrics: dict[str, float]
    videos: Path | None = None  # the folder the episodes were filmed into, if they were

    def summary(self) -> str:
        mean, std = self.metrics.get("eval/return", math.nan), self.metrics.get("eval/return_std", math.nan)
        length = self.metrics.get("eval/length", math.nan)
        filmed = f"; videos in {self.videos}" if self.videos is not None else ""
        return (
            f"eval: {self.episodes} deterministic episode(s) of {self.checkpoint.name}: return {mean:.1f} ± {std:.1f}"
            f" (mean length {length:.0f}){filmed}"
        )


def evaluate_run(run_dir: str | Path, episodes: int = 10, video: bool = False) -> Evaluation:
    run_dir = Path(run_dir)
    graph, checkpoint, state = _finished(run_dir)
    simulator, trainer, weights_port, policy = _roles(graph)
    with tempfile.TemporaryDirectory(prefix="m2flow-eval-") as scratch:
        actor = _restored(graph, trainer, checkpoint, state, scratch)
        weights = getattr(actor, weights_port)()
        args = copy.deepcopy(graph.workers[simulator].args)
        evaluation = {"policy": graph.workers[policy].args, "seed": EVALUATION_SEED, **args.get("evaluation", {})}
        args["evaluation"] = {**evaluation, "episodes": episodes}
        if video:
            args["video"] = {**args.get("video", {}), "save": True}
        env = _build(graph, simulator, 0, str(run_dir / "eval"), args)
        if simulator in state and hasattr(env, "load_state_dict"):
            env.load_state_dict(state[simulator][0][0])  # what it normalises observations with
        env.evaluate(weights)
        filmed = run_dir / "eval" / "videos" / simulator  # where a simulator films (its output_dir's videos/)
        return Evaluation(checkpoint, episodes, env.metrics(), filmed if video and any(filmed.glob("*")) else None)


def export_run(run_dir: str | Path, to: str | Path) -> Path:
    """The training worker of the run's latest checkpoint writes its policy with its `export` hook."""
    run_dir = Path(run_dir)
    graph, checkpoint, state = _finished(run_dir)
    trainers = [name for name, info in graph.info.items() if info.kind == "training" and "export" in info.ports]
    if not trainers:
        raise SpecError([f"{run_dir}: no training worker with an `export` port (PPO over model: hf has one)"])
    with tempfile.TemporaryDirectory(prefix="m2flow-export-") as scratch:
        return Path(_restored(graph, trainers[0], checkpoint, state, scratch).export(str(to)))


def _finished(run_dir: Path) -> tuple[MacroGraph, Path, dict]:
    """A run's workflow, its latest complete checkpoint and the state saved there."""
    from m2flow.runtime.checkpoint import latest_checkpoint, load_checkpoint

    if not (run_dir / "workflow.yaml").is_file():
        raise SpecError(
            [f"{run_dir}: not a run's folder (no workflow.yaml); give <run.output_dir>/<name>: runs/<name>"]
        )
    graph = build_graph(load_spec(run_dir / "workflow.yaml"), str(run_dir / "workflow.yaml"))
    checkpoint = latest_checkpoint(run_dir / "checkpoints")
    if checkpoint is None:
        raise SpecError(
            [f"{run_dir}: no complete checkpoint under checkpoints/; run longer or set run.checkpoint_every"]
        )
    return graph, checkpoint, load_checkpoint(checkpoint)[0]


def _restored(graph: MacroGraph, name: str, checkpoint: Path, state: dict, scratch: str) -> Any:
    """Worker `name` built on the CPU and restored from the checkpoint."""
    worker = _build(graph, name, 0, scratch)
    if hasattr(worker, "load_checkpoint") and (checkpoint / name).is_dir():
        worker.load_checkpoint(str(checkpoint / name))
    elif hasattr(worker, "load_state_dict") and name in state:
        worker.load_state_dict(state[name][0][0])
    return worker


def _roles(graph: MacroGraph) -> tuple[str, str, str, str]:
    """(the simulator, the training worker, its weights port, the policy worker) of the workflow."""
    if graph.loop is None:
        raise SpecError(["flow.loop: m2flow eval plays the loop's simulator: this workflow has no loop"])
    simulator = graph.loop.entry.worker
    if "evaluate" not in graph.info[simulator].ports:
        raise SpecError(
            [f"workers.{simulator}.class: {graph.workers[simulator].cls} has no `evaluate` port to play episodes"]
        )
    loop_workers = set(graph.loop.workers)
    for edge in (sync.edge for sync in graph.sync):
        if edge.dst.worker in loop_workers and edge.dst.worker != simulator:
            return simulator, edge.src.worker, edge.src.port, edge.dst.worker
    raise SpecError(["flow.sync: no sync edge gives the loop's policy its weights (e.g. actor.weights -> rollout...)"])


def _build(graph: MacroGraph, name: str, replica: int, output_dir: str, args: dict[str, Any] | None = None) -> Any:
    """One instance of a worker, built as the runtime builds it (its context, its args), on the CPU."""
    spec = graph.workers[name]
    items = graph.info[name].items_per_replica
    set_context(
        WorkerContext(
            worker=name,
            kind=spec.kind,
            items=(replica * items, (replica + 1) * items),
            replica_items=(replica * items, (replica + 1) * items),
            seed=graph.spec.run.seed,
            backend=spec.backend,
            output_dir=output_dir,
            iterations=graph.spec.run.iterations,
        )
    )
    return graph.info[name].target(**(spec.args if args is None else args))
