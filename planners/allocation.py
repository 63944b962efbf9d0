"""How much of the cluster each worker gets: for every worker declared `replicas: auto` (or `{min, max}`),
and for the loop's simulator with `placement.search_processes`, the planner tries replica counts and keeps
the layout whose plan is predicted fastest.

The loop's first worker (the simulator) keeps its total envs: more processes means fewer envs each (its
config's `items_field`). Other workers add replicas; a layout the graph refuses (a loop worker with more
replicas than the simulator has shards, a data-parallel group without a shard per rank) is skipped. The
search is coordinate descent: one worker's count at a time, the others held, two sweeps at most. A sweep
tries the most replicas first and skips, unsimulated, a layout whose floor (`planners/floor.py`: its busiest
loop replica's work, and its after-loop call on the most rows) is above the best plan found so far. No plan
is predicted under its floor, so a skipped layout could not have been chosen; its row in the candidates shows
its floor. The layout the search starts from is tried in its turn (it is often the slowest: one replica).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, replace

from m2flow.cluster import Cluster
from m2flow.config import apply_overrides, spec_from_dict
from m2flow.errors import PlanError, SpecError
from m2flow.graph import MacroGraph, build_graph
from m2flow.planners.base import device_kind
from m2flow.planners.floor import iteration_floor_s
from m2flow.planners.profile import Profile
from m2flow.planners.render import camera_gpus
from m2flow.schedule import Candidate, Plan

PlanWith = Callable[[MacroGraph, Cluster, Profile], Plan]
SWEEPS = 2
# the floor and the simulator add the same costs in another order: equal ones may differ in the last bits
ROUNDING = 1e-9


@dataclass(frozen=True)
class Layout:
    """Replica counts (and, for the simulator, envs per replica) the planner tries."""

    counts: tuple[tuple[str, int], ...]

    @classmethod
    def of(cls, counts: dict[str, int]) -> Layout:
        return cls(tuple(sorted(counts.items())))

    def overrides(self, graph: MacroGraph) -> list[str]:
        out = []
        entry = graph.loop.entry.worker if graph.loop is not None else None
        for worker, count in self.counts:
            out.append(f"workers.{worker}.replicas={count}")
            info = graph.info[worker]
            if worker == entry:
                total = info.replicas * info.items_per_replica
                out.append(f"workers.{worker}.args.{info.items_field}={total // count}")
        return out

    def label(self, graph: MacroGraph) -> str:
        entry = graph.loop.entry.worker if graph.loop is not None else None
        parts = []
        for worker, count in self.counts:
            info = graph.info[worker]
            envs = f" x {info.replicas * info.items_per_replica // count}" if worker == entry else ""
            parts.append(f"{worker} {count}{envs}")
        return ", ".join(parts)


def options(graph: MacroGraph, cluster: Cluster) -> dict[str, list[int]]:
    """The replica counts to try for each worker whose count the planner chooses."""
    out = {}
    entry = graph.loop.entry.worker if graph.loop is not None else None
    for name, spec in graph.workers.items():
        scaling = spec.scaling
        if scaling is None and not (name == entry and graph.spec.placement.search_processes):
            continue
        info = graph.info[name]
        devices = cluster.count(device_kind(graph, name, cluster))
        low, high = (scaling.min, scaling.max or devices) if scaling else (1, devices)
        high = min(high, devices)
        if name == entry:
            if info.items_field is None:
                raise PlanError(
                    f"workers.{name}.replicas: the loop's first worker splits its envs over the replicas the"
                    f" planner chooses, but {spec.cls} declares no items field in its Config (see m2flow.WorkerConfig)"
                )
            total = info.replicas * info.items_per_replica
            out[name] = [d for d in range(low, min(high, total) + 1) if total % d == 0]
        else:
            powers = [2**k for k in range(high.bit_length()) if low <= 2**k <= high]
            out[name] = sorted({low, *powers, high} & set(range(low, high + 1)))
    return out


class Allocation:
    """The search: every layout evaluated once, every plan's candidate rows kept for the dry run."""

    def __init__(self, graph: MacroGraph, cluster: Cluster, profile: Profile, plan_with: PlanWith):
        self.graph, self.cluster, self.profile, self.plan_with = graph, cluster, profile, plan_with
        self.options = options(graph, cluster)
        self.tried: dict[Layout, Plan | None] = {}
        self.rows: list[Candidate] = []
        self.skipped = 0  # layouts whose floor was above the best plan found by then

    def best(self) -> Plan:
        if not self.options:
            return self.plan_with(self.graph, self.cluster, self.profile)
        counts = {w: self.graph.workers[w].count for w in self.options}
        best: Plan | None = None
        for _ in range(SWEEPS):
            start = dict(counts)
            for worker, choices in self.options.items():
                incumbent = dict(counts)  # the layout the sweep begins with: it keeps its place on a tie
                # more replicas first: their plans are the faster as a rule, so the floor skips more of the rest
                for n in sorted(choices, reverse=True):
                    trial = {**counts, worker: n}
                    plan = self.evaluate(trial, best)
                    if plan is not None and _better(plan, best, trial == incumbent, counts == incumbent):
                        best, counts = plan, trial
            if counts == start:
                break
        if best is None:
            reasons = "\n".join(f"  - {row.reason}" for row in self.rows if not row.feasible)  # none was skipped
            raise PlanError(f"no replica counts fit this cluster:\n{reasons}")
        chosen = best.candidates[0].layout  # every row of a layout's plan carries its label
        best.candidates = sorted(self.rows, key=lambda row: _rank(row, chosen))
        tried = sum(plan is not None for plan in self.tried.values())
        skipped = f"; {self.skipped} skipped: their floor is above the best" if self.skipped else ""
        best.notes[:0] = [f"allocation: {chosen} (best of {tried} feasible layouts{skipped})", *self.idle(best)]
        return best

    def idle(self, plan: Plan) -> list[str]:
        """Devices no replica uses and no camera renders on, and why."""
        used = set(plan.occupants()) | camera_gpus(self.graph, plan)
        notes = []
        for kind in ("gpu", "cpu"):
            idle = [d for d in self.cluster.of_kind(kind) if d not in used]
            if not idle:
                continue
            scaling = [w for w in self.options if device_kind(self.graph, w, self.cluster) == kind]
            why = (
                f"more replicas of {', '.join(scaling)} were predicted no faster, or their shards or ranges limit them"
                if scaling
                else f"no worker on {kind}s has replicas: auto"
            )
            names = ", ".join(d.name for d in idle[:4]) + (f" and {len(idle) - 4} more" if len(idle) > 4 else "")
            notes.append(f"left idle: {len(idle)} {kind}(s) ({names}): {why}")
        return notes

    def evaluate(self, counts: dict[str, int], best: Plan | None = None) -> Plan | None:
        """The plan of these replica counts, or None where they do not fit or (given the `best` so far) their
        floor shows they cannot beat it."""
        layout = Layout.of(counts)
        if layout not in self.tried:
            self.tried[layout] = self._plan(layout, best)
        return self.tried[layout]

    def _plan(self, layout: Layout, best: Plan | None) -> Plan | None:
        label = layout.label(self.graph)
        overrides = layout.overrides(self.graph)
        try:
            raw = apply_overrides(copy.deepcopy(self.graph.spec.to_dict()), overrides, "allocation")
            graph = build_graph(spec_from_dict(raw))
        except SpecError as exc:
            self.rows.append(Candidate.infeasible("layout", exc.problems[0], label))
            return None
        items = {name: info.items_per_replica for name, info in graph.info.items()}
        profile = replace(self.profile, items_per_replica=items)
        floor_s = iteration_floor_s(graph, profile)
        if best is not None and floor_s > best.predicted.iteration_s * (1 + ROUNDING):
            self.skipped += 1
            self.rows.append(Candidate.skipped(label, floor_s, best.predicted.iteration_s))
            return None
        try:
            plan = self.plan_with(graph, self.cluster, profile)
        except PlanError as exc:
            self.rows.append(Candidate.infeasible(graph.spec.placement.mode, str(exc), label))
            return None
        plan.spec_overrides = overrides
        for row in plan.candidates:
            row.layout = label
        self.rows += plan.candidates
        return plan


def _rank(row: Candidate, chosen: str) -> tuple:
    """The dry run's order: plans fastest first (the chosen layout's first on a tie), then the layouts skipped
    by their floor, lowest first, then the infeasible ones."""
    return (not row.feasible, row.floor_s is None, row.iteration_s or row.floor_s or 0.0, row.layout != chosen)


def _better(plan: Plan, best: Plan | None, is_incumbent: bool, best_is_incumbent: bool) -> bool:
    """Whether `plan` takes the place of `best` in a worker's sweep (from the most replicas down): faster, or as
    fast and either the layout the sweep began with (the incumbent) or fewer replicas than a `best` that is not
    the incumbent. So the sweep keeps what one from the incumbent, then from the fewest replicas up, keeps:
    the incumbent if it is among the fastest, else the fewest replicas among them."""
    if best is None:
        return True
    if plan.predicted.iteration_s != best.predicted.iteration_s:
        return plan.predicted.iteration_s < best.predicted.iteration_s
    return is_incumbent or not best_is_incumbent
