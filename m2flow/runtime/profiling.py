"""`m2flow profile`: run each port of the real workers briefly at a few batch sizes and fit its cost.

Each batch size is a short run of the workflow itself (its declared processes, one stage, every task
traced), so the costs include what processes sharing a machine or a GPU do to each other (but not calls
that ran at once on one core: each counts its share of that core's time, `planners/trace_calls.py`); the fitted
`fixed_s + per_item_s * items` per port is written as the workflow's profile, which `m2flow plan` and
`m2flow run` then use.
"""

from __future__ import annotations

import copy
import json
import shutil
import tempfile
from collections import defaultdict

from m2flow.config import spec_from_dict
from m2flow.errors import M2FlowError
from m2flow.graph import MacroGraph, build_graph
from m2flow.planners.fit import fit_line, fit_points
from m2flow.planners.trace_calls import ReplicaPoints, hop_from_trace, points_from_trace, replica_points
from m2flow.runtime.executor import execute
from m2flow.spec import WorkflowSpec

PROFILE_STEPS = 64
PROFILE_ITERATIONS = 3


def batch_sizes(graph: MacroGraph) -> list[int]:
    """Items per replica of the loop's entry worker to measure at: its own, a half and a quarter of it
    (only its own when it declares no field for them)."""
    if graph.loop is None:
        return [1]
    entry = graph.info[graph.loop.entry.worker]
    n = entry.items_per_replica
    return sorted({max(1, n // 4), max(1, n // 2), n}) if entry.items_field else [n]


def measure_profile(spec: WorkflowSpec) -> dict:
    points: dict[str, list] = defaultdict(list)
    hops: list[tuple[int, float]] = []
    graph = build_graph(spec)
    chain = [str(p) for p in graph.loop.ports] if graph.loop else []
    sizes = batch_sizes(graph)
    by_replica: ReplicaPoints = {}
    replicas = {name: info.replicas for name, info in graph.info.items()}
    out, kept = tempfile.mkdtemp(prefix="m2flow-profile-"), False
    try:
        for size in sizes:
            run = execute(_profiling_spec(graph, size, out))
            trace = json.loads((run.run_dir / "trace.json").read_text())
            for port, samples in points_from_trace(trace, skip_iterations=1).items():
                points[port] += samples
            by_replica |= replica_points(trace, replicas, skip_iterations=1)  # the largest size's stand
            hop = hop_from_trace(trace, chain) if chain else None
            if hop is not None:
                hops.append((size, hop))
    except M2FlowError as exc:  # its runs' folders (logs, crashes/) are what the user reads next: kept
        exc.add_note(f"m2flow profile: its runs are kept in {out}")
        kept = True
        raise
    finally:
        if not kept:
            shutil.rmtree(out, ignore_errors=True)
    profile = fit_points(points, f"measured by m2flow profile at {sizes} items per replica", by_replica=by_replica)
    profile["workflow"] = spec.name
    return profile | message_cost(hops)


def message_cost(hops: list[tuple[int, float]]) -> dict[str, float]:
    """A loop message's cost between processes from the hop seen at each batch size (`(items, seconds)`: a message
    carries a replica's items): `hop_s` per message and `hop_item_s` per item, the line through them; all per
    message where one size was seen; nothing where none was."""
    if not hops:
        return {}
    line = fit_line(hops, prior_fixed=1.0)
    return {"hop_s": line.fixed_s, "hop_item_s": line.per_item_s}


def _profiling_spec(graph: MacroGraph, size: int, out: str) -> WorkflowSpec:
    spec = graph.spec
    raw = copy.deepcopy(spec.to_dict())
    raw["name"] = f"{spec.name}-profile-{size}"
    loop = raw["flow"].get("loop")
    if loop:
        loop["horizon"] = min(loop["horizon"], PROFILE_STEPS)
        entry = graph.info[graph.loop.entry.worker]
        if entry.items_field:
            raw["workers"][entry.name]["args"][entry.items_field] = size
    raw["placement"] = {
        **raw["placement"],
        "mode": "shared",
        "pipeline_stages": 1,
        "offload": "always",
        "profile": None,
        "colocate": False,  # a process per replica: the hop measured between env and policy is a real one
    }
    raw["run"].update(
        iterations=PROFILE_ITERATIONS,
        trace_detail_iterations=PROFILE_ITERATIONS,
        checkpoint_every=0,
        output_dir=out,
        resume=False,
        progress=False,
    )
    return spec_from_dict(raw, f"{spec.name} (profiling)")
