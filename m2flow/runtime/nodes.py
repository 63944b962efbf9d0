"""Which of a plan's nodes still answer. After a failure the run probes them before it restarts: a node
that is gone, or cut off by a partition, is left out and the run re-plans on the nodes left."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


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
    if not refs:
        return set(node_ids)  # none alive to ask (or none asked)
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


def driver_node() -> str | None:
    """The Ray node id of the node this driver runs on; None for a Ray client's driver, which runs on none."""
    import ray

    return None if ray.util.client.ray.is_connected() else ray.get_runtime_context().get_node_id()


def addresses() -> dict[str, str]:
    """Every node's IP address, by Ray node id."""
    import ray

    return {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()}


def process_name(address: str, pid: int) -> str:
    """A worker process's name in the run's folders, unique across hosts that share them: its node's address
    and its pid."""
    return f"{address}-{pid}"


class Unreached(Exception):  # noqa: N818 - a node that did not answer, said why
    """A node that did not run a pinned task in time (cut off, gone), or could not run it."""


def run_on(node: str, task: Callable[..., Any], *args: Any, timeout_s: float) -> Any:
    """`task(*args)`, run on Ray node `node` (no CPU reserved); `Unreached` saying why when the node does not
    run it within `timeout_s`, or cannot."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    pinned = ray.remote(task).options(
        num_cpus=0, max_retries=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
    )
    ref = pinned.remote(*args)
    try:
        return ray.get(ref, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        ray.cancel(ref, force=True)
        raise Unreached("its host did not answer in time") from None
    except ray.exceptions.RayError:
        raise Unreached("its host could not be asked") from None


def _answer() -> bool:
    return True
