"""Workers computing on several cores (`resources.threads`), as the plan explains them.

A CPU replica declared with `threads: n` is pinned to its own core and the next n - 1 of its node and runs
torch on n intra-op threads. The graph allows it only outside the loop of a synchronous flow, where no other
worker computes beside it, so the cores it borrows are idle then and the cost model charges no contention.
Its costs are measured and cached at that thread count (`planners/cache.py`); busy time counts its calls on
its own core.
"""

from __future__ import annotations

from m2flow.graph import MacroGraph, threads_refusal
from m2flow.schedule import Plan


def threads_notes(graph: MacroGraph, plan: Plan) -> list[str]:
    """One line per worker declared on several cores: the cores its replicas compute on, or why none; and one
    per CPU training worker on one core that could compute on more: how."""
    notes = []
    for name, placement in plan.placements.items():
        threads = graph.workers[name].resources.threads
        if threads == 1:
            notes += _could_borrow(graph, plan, name)
            continue
        if placement.device_kind != "cpu":
            notes.append(
                f"threads: {name} runs on {placement.device_kind}s; resources.threads ({threads}) sets the cores of"
                " CPU replicas only"
            )
            continue
        cores = "; ".join(
            f"[{replica}] {' + '.join(core.name for core in plan.cluster.cores_from(device, threads))}"
            for replica, device in enumerate(placement.replica_devices)
        )
        notes.append(
            f"threads: {name} computes on {threads} cores a replica (resources.threads), idle then outside the"
            f" loop: {cores}; its busy time counts on its own core"
        )
    return notes


def _could_borrow(graph: MacroGraph, plan: Plan, name: str) -> list[str]:
    """A note where training worker `name`, on one core a replica, leaves cores of its node idle while it
    computes (nothing else does then): the count a replica could compute on, and the key to declare it."""
    placement = plan.placements[name]
    if graph.info[name].kind != "training" or placement.device_kind != "cpu" or threads_refusal(graph.spec, name):
        return []
    device = placement.replica_devices[0]
    node = plan.cluster.cores_from(device, plan.cluster.count("cpu"))
    mine = sum(1 for other in placement.replica_devices if other in node)
    could = len(node) // mine
    if could < 2:
        return []
    return [
        f"threads: {name} computes on one core a replica while {len(node) - mine} more core(s) of node"
        f" n{device.node} idle outside the loop; workers.{name}.resources.threads: {could} would compute on"
        f" {could} (torch intra-op threads: faster for a large model or batch, slower for a small one; its costs"
        " are measured again)"
    ]
