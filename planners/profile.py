"""Cost of each worker port: declared in the workflow, else a default by worker kind.

A call of a port costs `fixed_s + per_item_s * items`; for a simulator, items are the envs stepped.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from m2flow.graph import MacroGraph
from m2flow.spec import PortCost

DEFAULT_COST = {
    "simulator": PortCost(fixed_s=5e-5, per_item_s=2e-4),
    "inference": PortCost(fixed_s=3e-4, per_item_s=2e-5),
    "training": PortCost(fixed_s=1e-2, per_item_s=2e-5),
    "function": PortCost(fixed_s=1e-4, per_item_s=0.0),
}
# Ports that only hand data on (a trajectory, weights): a fixed cost, whatever the worker's kind.
HANDOFF_COST = PortCost(fixed_s=1e-3, per_item_s=0.0)
HOST_DEVICE_GB_PER_S = 20.0  # a swap moves a worker's memory between device and pinned host memory


@dataclass
class Profile:
    costs: dict[str, PortCost] = field(default_factory=dict)
    items_per_replica: dict[str, int] = field(default_factory=dict)
    memory_gb: dict[str, float] = field(default_factory=dict)
    source: dict[str, str] = field(default_factory=dict)

    def call_s(self, worker: str, port: str, items: float) -> float:
        cost = self.costs.get(f"{worker}.{port}", HANDOFF_COST)
        return cost.fixed_s + cost.per_item_s * items

    def swap_s(self, worker: str, device_kind: str) -> float:
        """One offload or onload: declared as the worker's `onload` port cost, else memory over bandwidth."""
        declared = self.costs.get(f"{worker}.onload")
        if declared is not None and self.source.get(f"{worker}.onload") == "declared":
            return declared.fixed_s
        return self.memory_gb.get(worker, 0.0) / HOST_DEVICE_GB_PER_S if device_kind == "gpu" else 0.0

    @classmethod
    def from_graph(cls, graph: MacroGraph) -> Profile:
        """Declared costs from `workers.<name>.profile`, else defaults: by worker kind for the ports that
        compute (loop body, terminal after-loop ports), a small fixed cost for ports that hand data on."""
        sources = {str(e.src) for e in graph.then} | {str(e.src) for e, _ in graph.sync}
        computing_keys = {str(p) for p in graph.loop.body} if graph.loop else set()
        computing_keys |= {str(p) for p in graph.then_order if str(p) not in sources}
        profile = cls()
        for name, worker in graph.workers.items():
            profile.memory_gb[name] = worker.resources.memory_gb
            profile.items_per_replica[name] = int(worker.args.get("num_envs", 1))
            for port in graph.ports.get(name, ()):
                key = f"{name}.{port}"
                declared = worker.profile.get(port)
                default = DEFAULT_COST[worker.kind] if key in computing_keys else HANDOFF_COST
                profile.costs[key] = declared or default
                profile.source[key] = "declared" if declared else "default"
        return profile
