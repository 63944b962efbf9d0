"""Which loop ports merge pipeline slices: a call that takes in the later slices whose inputs have arrived.

Slicing the envs into S stages cuts each inference call to 1/S of the rows. Where a call's cost is mostly
per call (a policy on a GPU runs 4 rows about as fast as 16), the slices the simulators send while the
policy is busy are better acted on in one call. Taking slice s+1 (n rows) into the call of slice s delays
slice s's output by `cost(2n) - cost(n)` and hands slice s+1's over earlier by `2 cost(n) - cost(2n)`; it
pays when the gain is at least the delay, `2 cost(2n) <= 3 cost(n)`: for a cost `a + b * rows`, when the
per-call part a is at least the n rows' b * n.

Only ports the worker declares `batch_invariant` qualify: a merged call must give each row what a call of
its slice alone would (`m2flow/contract.py`), so merging, which depends on timing, changes no result.
"""

from __future__ import annotations

from dataclasses import dataclass

from m2flow.graph import MacroGraph
from m2flow.planners.profile import Profile
from m2flow.sharding import shard_groups, slice_sizes

MERGE_NOTE = "slices:"  # how a plan's note on merging slices begins


@dataclass(frozen=True)
class SliceCall:
    """A batch-invariant loop port's call of one slice (`rows` rows), and of two slices merged."""

    port: str
    rows: int
    one_s: float  # predicted seconds of a call of `rows`
    two_s: float  # of `2 * rows`

    @property
    def merging_pays(self) -> bool:
        """Taking a second slice into a call gains its caller at least the time it delays the first's (module doc)."""
        return 2 * self.two_s <= 3 * self.one_s


def slice_calls(graph: MacroGraph, profile: Profile, stages: int) -> list[SliceCall]:
    """Each batch-invariant loop port of a worker other than the simulators, with its slice's predicted cost."""
    if graph.loop is None or stages < 2:
        return []
    entry = graph.loop.entry.worker
    shards = graph.workers[entry].count
    slice_rows = slice_sizes(profile.items_per_replica.get(entry, 1), stages)[0]
    calls = []
    for port in graph.loop.body:
        if port.worker == entry or not graph.info[port.worker].batch_invariant(port.port):
            continue
        rows = slice_rows * max(len(group) for group in shard_groups(shards, graph.workers[port.worker].count))
        one, two = (profile.call_s(port.worker, port.port, n) for n in (rows, 2 * rows))
        calls.append(SliceCall(str(port), rows, one, two))
    return calls


def merge_slices(graph: MacroGraph, profile: Profile, stages: int) -> list[str]:
    """The loop's ports (`worker.port`) whose calls take in the later slices arrived, at `stages` stages:
    as `placement.merge_slices` says (auto: where it pays)."""
    wanted = graph.spec.placement.merge_slices
    return [call.port for call in slice_calls(graph, profile, stages) if _merges(call, wanted)]


def merge_notes(graph: MacroGraph, profile: Profile, stages: int) -> list[str]:
    """Why each batch-invariant loop port merges slices or not."""
    wanted = graph.spec.placement.merge_slices
    notes = []
    for call in slice_calls(graph, profile, stages):
        costs = f"{call.rows} rows a call are predicted {call.one_s:.3g} s, {2 * call.rows} rows {call.two_s:.3g} s"
        merges = _merges(call, wanted)
        how = "takes into one call the later slices arrived while it works" if merges else "calls each slice apart"
        if wanted == "auto":
            why = "mostly per call" if call.merging_pays else "mostly per row"
        else:
            why = f"placement.merge_slices: {str(wanted).lower()}"
        notes.append(f"{MERGE_NOTE} {call.port} {how}: {costs} ({why})")
    return notes


def _merges(call: SliceCall, wanted: bool | str) -> bool:
    return call.merging_pays if wanted == "auto" else bool(wanted)
