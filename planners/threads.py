"""Workers computing on several cores (`resources.threads`): the cores each replica gets, as the plan explains.

A CPU replica computing on n cores is pinned to n cores of its node and runs torch on n intra-op threads. The
graph allows a count above one only outside the loop of a synchronous flow, where no other worker computes
beside it, so the cores it borrows are idle then and the cost model charges no contention. Two things it does
not charge: a streamed part (`<port>_part`, `planners/base.py`'s streaming) is taken in during the loop, on the
loop's cores, and two workers' after-loop calls that do not wait for each other run at once, on the same cores
(the plan says so). A worker's replicas on one node take disjoint blocks of its cores, from its first
replica's core on (round the node's), so a block need not hold the replica's own slot: a count is at most the
node's cores shared among them, and `auto` is that share (one where a count above one is refused). Costs are
measured and cached per count (`planners/cache.py`); busy time is charged to each replica's planned slot.
"""

from __future__ import annotations

from m2flow.cluster import DeviceId
from m2flow.graph import MacroGraph, threads_refusal
from m2flow.schedule import Plan, ReplicaId


def replica_cores(graph: MacroGraph, plan: Plan, replica: ReplicaId) -> list[DeviceId]:
    """The cores `replica` computes on: its device alone, or its block of its node's cores."""
    device = plan.device_of(replica)
    if device.kind != "cpu":
        return [device]
    node, mine = _node_cores(plan, device), _on_node(plan, replica.worker, device)
    count = threads_of(graph, plan, replica.worker, device)
    if count == 1:
        return [device]
    start = node.index(plan.device_of(ReplicaId(replica.worker, mine[0]))) + mine.index(replica.replica) * count
    return [node[(start + k) % len(node)] for k in range(count)]


def threads_of(graph: MacroGraph, plan: Plan, name: str, device: DeviceId) -> int:
    """The cores a replica of `name` on CPU slot `device` computes on: as declared, at most its share of the
    node's cores; `auto`, that share."""
    declared = graph.workers[name].resources.threads
    if declared == 1 or (declared == "auto" and threads_refusal(graph.spec, name)):
        return 1
    share = _share(plan, name, device)
    return share if declared == "auto" else min(declared, share)


def threads_notes(graph: MacroGraph, plan: Plan) -> list[str]:
    """One line per worker on several cores (or `auto`): the cores its replicas compute on, or why one; and one
    per CPU training worker declared on one core that could compute on more: how."""
    notes = []
    for name, placement in plan.placements.items():
        declared = graph.workers[name].resources.threads
        if declared == 1:
            notes += _could_borrow(graph, plan, name)
        elif placement.device_kind != "cpu":
            notes.append(
                f"threads: {name} runs on {placement.device_kind}s; resources.threads ({declared}) sets the cores of"
                " CPU replicas only"
            )
        elif declared == "auto" and (why := threads_refusal(graph.spec, name)):
            notes.append(f"threads: {name} computes on one core a replica (resources.threads: auto): {why}")
        else:
            notes.append(_blocks_note(graph, plan, name))
    threaded = [name for name in plan.placements if _computes_on_several(graph, plan, name)]
    if len(threaded) > 1:
        notes.append(
            f"threads: {', '.join(threaded)} compute on several cores each outside the loop; where their calls run at"
            " once (after-loop edges that do not wait for each other) they share cores, which the plan does not"
            " charge"
        )
    return notes


def _blocks_note(graph: MacroGraph, plan: Plan, name: str) -> str:
    declared = graph.workers[name].resources.threads
    replicas = [ReplicaId(name, r) for r in range(len(plan.placements[name].replica_devices))]
    blocks = [replica_cores(graph, plan, r) for r in replicas]
    if all(len(block) == 1 for block in blocks):
        device = blocks[0][0]
        return (
            f"threads: {name} computes on one core a replica (resources.threads: {declared}): node n{device.node}'s"
            f" {len(_node_cores(plan, device))} core(s) shared among its {len(_on_node(plan, name, device))}"
            " replica(s) there"
        )
    cores = "; ".join(
        f"[{r.replica}] {' + '.join(core.name for core in block)}" for r, block in zip(replicas, blocks, strict=True)
    )
    lowered = declared != "auto" and any(len(block) < declared for block in blocks)
    why = f"; {declared} lowered to its node's cores shared among its replicas there" if lowered else ""
    return (
        f"threads: {name} computes on a block of its node's cores outside the loop, idle then (resources.threads:"
        f" {declared}): {cores}{why}; busy time is charged to each replica's planned slot"
    )


def _computes_on_several(graph: MacroGraph, plan: Plan, name: str) -> bool:
    placement = plan.placements[name]
    return placement.device_kind == "cpu" and any(
        len(replica_cores(graph, plan, ReplicaId(name, r))) > 1 for r in range(len(placement.replica_devices))
    )


def _node_cores(plan: Plan, device: DeviceId) -> list[DeviceId]:
    return [core for core in plan.cluster.of_kind("cpu") if core.node == device.node]


def _on_node(plan: Plan, name: str, device: DeviceId) -> list[int]:
    """The replicas of `name` on `device`'s node, by index."""
    return [r for r, other in enumerate(plan.placements[name].replica_devices) if other.node == device.node]


def _share(plan: Plan, name: str, device: DeviceId) -> int:
    """`device`'s node's cores divided among the replicas of `name` there (at least one)."""
    return max(1, len(_node_cores(plan, device)) // len(_on_node(plan, name, device)))


def _could_borrow(graph: MacroGraph, plan: Plan, name: str) -> list[str]:
    """A note where training worker `name`, on one core a replica, leaves cores of its node idle while it
    computes (nothing else does then): the key that would use them."""
    placement = plan.placements[name]
    if graph.info[name].kind != "training" or placement.device_kind != "cpu" or threads_refusal(graph.spec, name):
        return []
    device = placement.replica_devices[0]
    share = _share(plan, name, device)
    if share < 2:
        return []
    idle = len(_node_cores(plan, device)) - len(_on_node(plan, name, device))
    return [
        f"threads: {name} computes on one core a replica while {idle} more core(s) of node n{device.node} idle"
        f" outside the loop; workers.{name}.resources.threads: auto would compute on {share} (torch intra-op"
        " threads: faster for a large model or batch, slower for a small one; its costs are measured again)"
    ]
