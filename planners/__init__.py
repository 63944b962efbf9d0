"""Planning: pure computation over the macro graph, the cluster and the profile (no Ray, no torch)."""

from dataclasses import replace
from pathlib import Path

from m2flow.errors import PlanError
from m2flow.kinds import KINDS
from m2flow.planners import auto, disaggregated, hybrid, shared  # noqa: F401  (register the modes)
from m2flow.planners.allocation import Allocation
from m2flow.planners.base import Infeasible, Planner, device_kind, get_planner, placement_modes
from m2flow.planners.cache import EXECUTION_HOP, load_cached, load_calibration
from m2flow.planners.fit import load_profile
from m2flow.planners.manual import ManualPlanner
from m2flow.planners.profile import Profile
from m2flow.planners.render import render_notes
from m2flow.transfer import sync_transports

__all__ = [
    "Infeasible",
    "Planner",
    "Profile",
    "get_planner",
    "placement_modes",
    "compare_with_auto",
    "make_plan",
    "profile_path",
]


def profile_path(spec) -> Path:
    """Where `m2flow profile` writes, and `plan`/`run` look for, this workflow's measured costs."""
    return Path(spec.placement.profile or Path(spec.run.output_dir) / "profiles" / f"{spec.name}.json")


def load_measured(spec) -> dict | None:
    path = profile_path(spec)
    if spec.placement.profile and not path.exists():
        raise PlanError(f"placement.profile: no file {path}; run `m2flow profile` first or remove the key")
    return load_profile(path) if path.exists() else None


RENDERED_ON_GPU = "cpu, rendering on gpu"  # the costs of a simulator on the cores whose cameras EGL draws on a GPU


def device_kinds(graph, cluster) -> dict[str, str]:
    """What each worker's costs are measured on, known before any placement: its device kind (GPU or CPU); for a
    simulator with cameras on the cores of a cluster with GPUs, `RENDERED_ON_GPU` (`planners/render.py`: its frames
    are drawn there, at another cost than on the cores)."""
    kinds = {name: device_kind(graph, name, cluster) for name in graph.workers}
    if cluster.count("gpu"):
        kinds |= {name: RENDERED_ON_GPU for name, kind in kinds.items() if kind == "cpu" and _renders(graph, name)}
    return kinds


def ports_computing_on_gpu(graph, kinds: dict[str, str]) -> frozenset[str]:
    """Before any placement: every port of a worker on GPUs, and the ports that draw cameras of a simulator whose
    frames a GPU draws."""
    return frozenset(
        f"{name}.{port}"
        for name, kind in kinds.items()
        for port in graph.info[name].ports
        if kind == "gpu" or (kind == RENDERED_ON_GPU and graph.info[name].renders(port))
    )


def _renders(graph, name: str) -> bool:
    info = graph.info[name]
    return KINDS[info.kind].renders and bool(info.rendering_ports)


def profile_of(graph, cluster) -> Profile:
    """Costs from every source: declared, measured by `m2flow profile`, cached by earlier runs, defaults (as a GPU
    runs the work where it will: `ports_computing_on_gpu`)."""
    kinds = device_kinds(graph, cluster)
    on_gpu = ports_computing_on_gpu(graph, kinds)
    profile = Profile.from_graph(graph, load_measured(graph.spec), load_cached(graph, kinds), on_gpu)
    calibration = load_calibration(graph)
    profile.hop_item_s = calibration.get("hop_item_s", profile.hop_item_s)  # an execution no run measured
    profile.execution_hops = {
        key.removeprefix(EXECUTION_HOP): value for key, value in calibration.items() if key.startswith(EXECUTION_HOP)
    }
    profile.controller_s = calibration.get("controller_s", profile.controller_s)
    profile.beside_slowdown = calibration.get("beside_slowdown", profile.beside_slowdown)
    return profile


def make_plan(graph, cluster, profile=None, mode: str | None = None):
    """Plan `graph` on `cluster` in `mode` (default: the workflow's placement.mode)."""
    profile = profile or profile_of(graph, cluster)
    if graph.spec.placement.devices and mode is None:
        plan = ManualPlanner().plan(graph, cluster, profile)
    else:
        plan = Allocation(graph, cluster, profile, get_planner(mode or graph.spec.placement.mode).plan).best()
    plan.transports = sync_transports(graph, plan)
    plan.notes += [f"sync: {edge} moves by {transport}" for edge, transport in plan.transports.items()]
    plan.notes += render_notes(graph, plan)
    return plan


def compare_with_auto(graph, cluster, manual):
    """Set auto's best beside a hand layout: a note on what the hand-tuning gains or costs."""
    best = make_plan(graph, cluster, mode="auto")
    ratio = manual.predicted.iteration_s / best.predicted.iteration_s
    verdict = f"{ratio:.2f}x slower than" if ratio > 1.005 else ("as fast as" if ratio >= 0.995 else "faster than")
    manual.candidates = manual.candidates + [
        replace(row, mode=f"auto: {row.mode}") if row.floor_s is None else row for row in best.candidates
    ]
    manual.notes.append(
        f"your layout ({manual.mode}, {manual.pipeline_stages} stage(s)): {manual.predicted.iteration_s:.4g}"
        f" s/iteration, {verdict} auto's best ({best.mode}, {best.pipeline_stages} stage(s),"
        f" {best.predicted.iteration_s:.4g} s)"
    )
    return manual
