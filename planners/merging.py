"""Which loop ports merge pipeline slices: a call that takes in the later slices whose inputs have arrived.

Slicing the envs into S stages cuts each inference call to 1/S of the rows. Where a call's cost is mostly
per call (a policy on a GPU runs 4 rows about as fast as 16), the slices the simulators send while the
policy is busy are better acted on in one call. Taking slice s+1 (n rows) into the call of slice s delays
slice s's output by `cost(2n) - cost(n)` and hands slice s+1's over earlier by `2 cost(n) - cost(2n)`; it
pays when the gain is at least the delay, `2 cost(2n) <= 3 cost(n)`: for a cost `a + b * rows`, when the
per-call part a is at least the n rows' b * n.

Only ports the worker declares `batch_invariant` qualify: a merged call must give each row what a call of
its slice alone would (`m2flow/contract.py`), so that merging, which depends on timing, changes no result
where the declaration holds (`TorchPolicy`: on CPU, given env ids; on a GPU, kernels chosen by row count may
round differently in the last bits, and `placement.merge_slices: false` makes a run repeat exactly).
"""

from __future__ import annotations

from dataclasses import dataclass

from m2flow.graph import MacroGraph
from m2flow.kinds import KINDS
from m2flow.planners.profile import Profile
from m2flow.sharding import shard_groups, slice_sizes

MERGE_NOTE = "slices:"  # how a plan's note on merging slices begins


@dataclass(frozen=True)
class SliceCall:
    """A batch-invariant loop port's call of one slice (`rows` rows) and of two merged, and whether it merges."""

    port: str
    rows: int
    one_s: float  # predicted seconds of a call of `rows`
    two_s: float  # of `2 * rows`
    merges: bool
    why: str

    @property
    def note(self) -> str:
        how = "takes into one call the later slices arrived while it works" if self.merges else "calls each slice apart"
        costs = f"{self.rows} rows a call are predicted {self.one_s:.3g} s, {2 * self.rows} rows {self.two_s:.3g} s"
        return f"{MERGE_NOTE} {self.port} {how}: {costs} ({self.why})"


def slice_calls(
    graph: MacroGraph, profile: Profile, stages: int, beside_rendering: frozenset[str] = frozenset()
) -> list[SliceCall]:
    """Each batch-invariant loop port of a worker with one instance a replica (not a simulator, which holds one
    per slice), its slice's predicted cost (beside rendering for the ports in `beside_rendering`:
    `planners/render.py`), and whether it merges: as `placement.merge_slices` says, and on `auto` where taking a
    second slice into a call gains that slice at least the time it delays the first's."""
    if graph.loop is None or stages < 2:
        return []
    entry = graph.loop.entry.worker
    shards = graph.workers[entry].count
    slice_rows = slice_sizes(profile.items_per_replica.get(entry, 1), stages)[0]
    wanted = graph.spec.placement.merge_slices
    calls = []
    for port in graph.loop.body:
        info = graph.info[port.worker]
        if KINDS[info.kind].slices or not info.batch_invariant(port.port):
            continue
        rows = slice_rows * max(len(group) for group in shard_groups(shards, info.replicas))
        beside = str(port) in beside_rendering
        one, two = (profile.call_s(port.worker, port.port, n, beside) for n in (rows, 2 * rows))
        if wanted == "auto":
            pays = 2 * two <= 3 * one
            calls.append(SliceCall(str(port), rows, one, two, pays, "mostly per call" if pays else "mostly per row"))
        else:
            calls.append(SliceCall(str(port), rows, one, two, wanted, f"placement.merge_slices: {str(wanted).lower()}"))
    return calls


def merge_slices(
    graph: MacroGraph, profile: Profile, stages: int, beside_rendering: frozenset[str] = frozenset()
) -> list[str]:
    """The loop's ports (`worker.port`) whose calls take in the later slices arrived, at `stages` stages."""
    return [call.port for call in slice_calls(graph, profile, stages, beside_rendering) if call.merges]


def merge_notes(
    graph: MacroGraph, profile: Profile, stages: int, beside_rendering: frozenset[str] = frozenset()
) -> list[str]:
    """Why each batch-invariant loop port merges slices or not."""
    return [call.note for call in slice_calls(graph, profile, stages, beside_rendering)]
