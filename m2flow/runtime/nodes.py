"""Which of a plan's nodes still answer. After a failure the run probes them before it restarts: a node
that is gone, or cut off by a partition, is left out and the run re-plans on the nodes left."""

from __future__ import annotations


def unreachable(node_ids: tuple[str, ...], timeout_s: float) -> set[str]:
    """The nodes (Ray node ids) that did not run a no-op task within `timeout_s`: gone, or unreachable.
    Ray declares a cut-off node dead after its health checks fail, which ends the wait early."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    alive = {node["NodeID"] for node in ray.nodes() if node.get("Alive")}
    probe = ray.remote(num_cpus=0, max_retries=0)(_answer)
    refs = {
        probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(): node
        for node in node_ids
        if node in alive
    }
    ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    answered = set()
    for ref in ready:
        try:
            ray.get(ref)
        except ray.exceptions.RayError:
            continue
        answered.add(refs[ref])
    for ref in set(refs) - set(ready):
        ray.cancel(ref, force=True)
    return set(node_ids) - answered


def addresses() -> dict[str, str]:
    """Every node's IP address, by Ray node id."""
    import ray

    return {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()}


def _answer() -> bool:
    return True
