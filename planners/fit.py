"""Fit port costs `fixed_s + per_item_s * items` to measured calls (`planners/trace_calls.py` reads them from a
run's trace, a profiling run measures them): a line per port, kept per batch size and replica, saved and loaded as
a profile.

Pure computation; no Ray, no torch.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from pathlib import Path

from m2flow.errors import PlanError
from m2flow.planners.trace_calls import Points, ReplicaPoints, points_from_trace, started_at
from m2flow.spec import PortCost

ReplicaShares = dict[int, tuple[float, ...]]  # a replica count -> each replica's share of a call's cost there


@dataclass(frozen=True)
class SizeMean:
    """A port's mean cost at one batch size: `calls` calls of `items` items each took `mean_s` on average."""

    items: float
    mean_s: float
    calls: int


@dataclass(frozen=True)
class PortFit:
    """A port's cost `fixed_s + per_item_s * items` fitted to `calls` measured calls at `batch_sizes`, its mean at
    each (`by_size`, the smallest first) and how far what it was fitted to scatters around it (`residual`: the calls,
    or in the cost cache the kept runs' means). A port called outside the loop keeps, per replica count it was
    measured at, what each replica's calls cost against the line (`replica_shares`: `(2.0, 0.0)` at 2 replicas, the
    first does all of it, as work only replica 0 does). On disk: a JSON object with these keys, `by_size`
    as `[items, mean_s, calls]` rows, `replica_shares` as `{"2": [2.0, 0.0]}`."""

    fixed_s: float
    per_item_s: float
    calls: int = 0
    batch_sizes: tuple[int, ...] = ()
    by_size: tuple[SizeMean, ...] = ()
    residual: float = 0.0
    replica_shares: ReplicaShares = field(default_factory=dict)

    @property
    def cost(self) -> PortCost:
        """The fitted line, as the planner's profile holds a port's cost."""
        return PortCost(fixed_s=self.fixed_s, per_item_s=self.per_item_s)

    def to_dict(self) -> dict:
        return {
            "fixed_s": self.fixed_s,
            "per_item_s": self.per_item_s,
            "calls": self.calls,
            "batch_sizes": list(self.batch_sizes),
            "by_size": [[row.items, row.mean_s, row.calls] for row in self.by_size],
            "residual": self.residual,
            "replica_shares": {str(count): list(shares) for count, shares in self.replica_shares.items()},
        }

    @classmethod
    def from_dict(cls, data: dict) -> PortFit:
        """A fit as `to_dict` wrote it; a key it lacks besides its cost (a fit written down by hand, or before the
        key existed) reads as nothing measured. Raises KeyError without `fixed_s` or `per_item_s`, TypeError or
        ValueError where a value does not read as its field."""
        return cls(
            fixed_s=float(data["fixed_s"]),
            per_item_s=float(data["per_item_s"]),
            calls=int(data.get("calls", 0)),
            batch_sizes=tuple(int(size) for size in data.get("batch_sizes", [])),
            by_size=tuple(
                SizeMean(float(items), float(mean_s), int(calls)) for items, mean_s, calls in data.get("by_size", [])
            ),
            residual=float(data.get("residual", 0.0)),
            replica_shares=_shares_read(data.get("replica_shares", {})),
        )


def _shares_read(data: dict) -> ReplicaShares:
    """`replica_shares` as `to_dict` wrote them; ValueError where a count's shares are not that many."""
    shares = {int(count): tuple(float(share) for share in values) for count, values in data.items()}
    if any(len(values) != count for count, values in shares.items()):
        raise ValueError(f"replica_shares {data}: a replica count's shares are not that many")
    return shares


def fit_line(points: list[tuple[float, float]], prior_fixed: float = 0.0) -> PortCost:
    """Least squares `fixed_s + per_item_s * items` with non-negative coefficients. Seen at one batch size
    only, the split between the two cannot be measured: `prior_fixed` (a fraction of the cost there) is
    taken as the per-call part."""
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mean_x) ** 2 for x in xs)
    if var == 0:
        if mean_x <= 0:
            return PortCost(fixed_s=mean_y, per_item_s=0.0)
        return PortCost(fixed_s=prior_fixed * mean_y, per_item_s=(1 - prior_fixed) * mean_y / mean_x)
    slope = max(0.0, sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / var)
    fixed = mean_y - slope * mean_x
    if fixed < 0:
        return PortCost(fixed_s=0.0, per_item_s=sum(x * y for x, y in points) / sum(x * x for x in xs))
    return PortCost(fixed_s=fixed, per_item_s=slope)


# How far one run's mean cost of a port at a batch size may lie from another run's: on the 2-core machine a step
# moved 0.7-1.5x between runs (planners/cache.py), and the medians the cache keeps narrow that.
RUN_SCATTER = 0.1


def line_through_means(means: list[tuple[float, float]]) -> PortCost:
    """The line through a port's mean cost at each batch size seen (`(items, mean_s)`), its per-call part shrunk
    toward none by how uncertain it is. Each mean came from other runs, of other process layouts, and may be off
    by `RUN_SCATTER` of itself; a per-call part read from two sizes carries that noise magnified (at sizes 4 and 8,
    twice the first mean less the second), and a plan slicing below the sizes seen pays it once per slice. So the
    per-call part a is scaled by a^2 / (a^2 + v), v its variance under that noise: a part as large as its noise
    keeps half of itself, one far above it (a GPU kernel's flat cost) nearly all. The line keeps its cost at the
    sizes' mean. A cost that does not grow with the batch is all per call and kept as it is: its per-call part is
    the means' mean, not a line's intercept. Not toward the worker kind's default share: scaled to a measured cost,
    a simulator's 4% became a per-call part of 2.18 ms where the sizes showed none (benchmarks/RESULTS.md, the
    dec06b sweep)."""
    line = fit_line(means)
    if len({x for x, _ in means}) < 2 or line.fixed_s <= 0 or line.per_item_s == 0:
        return line
    xs = [x for x, _ in means]
    mean_x, mean_y = sum(xs) / len(xs), sum(y for _, y in means) / len(means)
    spread = sum((x - mean_x) ** 2 for x in xs)
    weights = [1 / len(means) - mean_x * (x - mean_x) / spread for x in xs]  # intercept = a weighted sum of the means
    variance = sum((w * RUN_SCATTER * y) ** 2 for w, (_, y) in zip(weights, means, strict=True))
    fixed = line.fixed_s * line.fixed_s**2 / (line.fixed_s**2 + variance)
    return PortCost(fixed_s=fixed, per_item_s=(mean_y - fixed) / mean_x)


def residual(points: list[tuple[float, float]], line: PortCost) -> float:
    """The line's root-mean-square error relative to the mean cost (0.1: calls scatter by ~10% around it)."""
    mean_y = sum(y for _, y in points) / len(points)
    squares = sum((y - line.fixed_s - line.per_item_s * x) ** 2 for x, y in points) / len(points)
    return squares**0.5 / mean_y if mean_y > 0 else 0.0


def fit_points(
    points: Points, source: str, priors: dict[str, float] | None = None, by_replica: ReplicaPoints | None = None
) -> dict:
    """`{"source": source, "ports": {port: PortFit}}`; `priors[port]` is its per-call fraction when it was seen at
    one batch size only; `by_replica[port]`, its calls replica by replica (`replica_points`), gives its shares."""
    ports = {}
    for port, samples in sorted(points.items()):
        line = fit_line(samples, (priors or {}).get(port, 0.0))
        ports[port] = PortFit(
            fixed_s=line.fixed_s,
            per_item_s=line.per_item_s,
            calls=len(samples),
            batch_sizes=tuple(sorted({int(x) for x, _ in samples})),
            by_size=by_size(samples),
            residual=residual(samples, line),
            replica_shares=shares_of((by_replica or {}).get(port, {}), line),
        )
    return {"source": source, "ports": ports}


def shares_of(by_replica: dict[int, list[tuple[float, float]]], line: PortCost) -> ReplicaShares:
    """Each replica's work over what `line` gives its calls (1.0: as the line; the items each call carried are the
    line's to count, not the share's), at the replica count seen; none where no replica was seen."""
    shares = []
    for replica in range(len(by_replica)):
        calls = by_replica[replica]
        expected = sum(line.fixed_s + line.per_item_s * items for items, _ in calls)
        shares.append(sum(seconds for _, seconds in calls) / expected if expected > 0 else 1.0)
    return {len(shares): tuple(shares)} if shares else {}


def by_size(points: list[tuple[float, float]]) -> tuple[SizeMean, ...]:
    """The mean cost at each batch size seen, the smallest first."""
    seen: dict[float, list[float]] = defaultdict(list)
    for items, seconds in points:
        seen[items].append(seconds)
    return tuple(SizeMean(items, sum(costs) / len(costs), len(costs)) for items, costs in sorted(seen.items()))


def merged(earlier: PortFit | None, fit: PortFit) -> PortFit:
    """A port's fit over the batch sizes an earlier fit saw and those `fit` saw: where both saw a size, the
    later mean stands. Seen at several sizes, the line through their means splits the per-call cost from the
    per-item one, which one size alone cannot (a camera simulator rendering on a GPU costs about the same
    per call for half its envs: a pipelined plan's slices are not half as cheap; `line_through_means`)."""
    rows = {row.items: row for row in earlier.by_size} if earlier else {}
    own = {row.items for row in fit.by_size}
    if not own or set(rows) <= own:
        return replace(fit, replica_shares=latest_shares(earlier, fit))  # nothing seen earlier at another size
    rows.update({row.items: row for row in fit.by_size})
    ordered = tuple(rows[items] for items in sorted(rows))
    means = [(row.items, row.mean_s) for row in ordered]
    line = line_through_means(means)
    return PortFit(
        fixed_s=line.fixed_s,
        per_item_s=line.per_item_s,
        calls=sum(row.calls for row in ordered),
        batch_sizes=tuple(int(items) for items, _ in means),
        by_size=ordered,
        residual=residual(means, line),
        replica_shares=latest_shares(earlier, fit),
    )


def scaled(fit: PortFit, factor: float) -> PortFit:
    """`fit` with every cost `factor` times as long: its line and its mean at each size (its calls, sizes, scatter
    and replicas' shares as they were)."""
    return replace(
        fit,
        fixed_s=fit.fixed_s * factor,
        per_item_s=fit.per_item_s * factor,
        by_size=tuple(replace(row, mean_s=row.mean_s * factor) for row in fit.by_size),
    )


def latest_shares(earlier: PortFit | None, fit: PortFit) -> ReplicaShares:
    """The replicas' shares of a port's cost at each replica count, as the latest fit that measured them there has
    them."""
    return {**(earlier.replica_shares if earlier else {}), **fit.replica_shares}


def fit_trace_file(path: str | Path, ports: Collection[str]) -> dict:
    """The fits of a run's trace.json (`m2flow profile --from-trace`) for `ports` ("worker.port"), the workflow's; a
    PlanError where the file cannot be read or holds no call of them."""
    try:
        trace = json.loads(Path(path).read_text())
    except OSError as exc:
        raise PlanError(f"--from-trace: cannot read {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise PlanError(f"--from-trace: {path} is not a trace (not JSON: {exc}); give a run's trace.json") from None
    try:  # each start of the workers' first iteration warmed up, as the run left it out
        points = points_from_trace(trace, warmups=[start.iteration for start in started_at(trace["traceEvents"])])
    except (TypeError, KeyError, AttributeError, ValueError):
        raise PlanError(f"--from-trace: {path} is JSON but not a trace m2flow wrote; give a run's trace.json") from None
    if not any(port in ports for port in points):
        raise PlanError(
            f"--from-trace: {path} holds no call of this workflow's ports; give the trace of a run of this workflow"
        )
    return fit_points(points, f"trace {path}")


def save_profile(profile: dict, path: str | Path) -> Path:
    """Write a profile (`fit_points`' with what `m2flow profile` adds: workflow, hop_s, hop_item_s) as JSON, its
    fits as `PortFit.to_dict` writes them."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    ports = {port: fit.to_dict() for port, fit in profile["ports"].items()}
    tmp.write_text(json.dumps({**profile, "ports": ports}, indent=1))
    tmp.replace(path)
    return path


def load_profile(path: str | Path) -> dict:
    """A profile `save_profile` wrote, its fits read back as `PortFit`s; a fit that does not read as one is refused,
    naming the file and the port."""
    profile = json.loads(Path(path).read_text())
    ports = {}
    for port, fit in profile.get("ports", {}).items():
        try:
            ports[port] = PortFit.from_dict(fit)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise PlanError(
                f"{path}: ports.{port} does not read as a measured cost ({type(exc).__name__}: {exc}); run"
                " `m2flow profile` again, or fix or delete the file"
            ) from None
    return {**profile, "ports": ports}
