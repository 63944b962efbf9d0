"""The devices a plan places workers on: GPUs, and CPU slots (one per core) for CPU work.

A device is named by a typed reference, `DeviceId(node, kind, index)`: `index` counts devices of its
kind across the cluster, so `n1/gpu9` is the tenth GPU, on node 1. Plans, the simulator, the executor
and the trace all use these references; nothing indexes devices by a bare integer.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass
from typing import Literal

from m2flow.spec import ClusterSpec

DEFAULT_GPU_MEMORY_GB = 80.0  # an H100/A100-80G, where the GPUs' memory is neither given nor visible here

DeviceKind = Literal["gpu", "cpu"]
_NAME = re.compile(r"^n(\d+)/(gpu|cpu)(\d+)$")


@dataclass(frozen=True, order=True)
class DeviceId:
    node: int
    kind: DeviceKind
    index: int

    def __post_init__(self) -> None:
        # devices key the planner's dicts by the million: the hash is computed once, in this process (pickling
        # leaves it out: a string's hash differs from process to process)
        object.__setattr__(self, "_hash", hash((self.node, self.kind, self.index)))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple:
        return DeviceId, (self.node, self.kind, self.index)

    def __setstate__(self, state: dict) -> None:  # a device pickled before its hash was kept: its fields alone
        for name in ("node", "kind", "index"):
            object.__setattr__(self, name, state[name])
        self.__post_init__()

    @property
    def name(self) -> str:
        return f"n{self.node}/{self.kind}{self.index}"

    def __str__(self) -> str:
        return self.name

    @classmethod
    def parse(cls, name: str) -> DeviceId:
        match = _NAME.match(name)
        if not match:
            raise ValueError(f"'{name}' is not a device name like n0/gpu3")
        return cls(int(match.group(1)), match.group(2), int(match.group(3)))


@dataclass(frozen=True)
class Cluster:
    """The devices, each with its memory, and the nodes they sit on."""

    memory_gb: dict[DeviceId, float]  # every device of the cluster, in order: GPUs, then CPU slots
    nodes: int
    node_ids: tuple[str, ...] = ()  # Ray's id of each node, when planned on a live Ray cluster

    @property
    def devices(self) -> list[DeviceId]:
        return list(self.memory_gb)

    def of_kind(self, kind: DeviceKind) -> list[DeviceId]:
        return [d for d in self.memory_gb if d.kind == kind]

    def count(self, kind: DeviceKind) -> int:
        return len(self.of_kind(kind))

    def on_node(self, ref: DeviceId) -> int:
        """The node-local position of a device among its node's devices of its kind: the core a replica on a
        CPU slot is pinned to, the GPU's index on its host."""
        return sum(1 for d in self.memory_gb if d.kind == ref.kind and d.node == ref.node and d.index < ref.index)

    def fewest_cores(self) -> int:
        """The CPU slots of the node with the fewest (of the nodes that have any)."""
        per_node = Counter(d.node for d in self.memory_gb if d.kind == "cpu")
        return min(per_node.values(), default=0)

    def to_dict(self) -> dict:
        return {
            "nodes": self.nodes,
            "devices": [{"name": d.name, "memory_gb": gb} for d, gb in self.memory_gb.items()],
            "node_ids": list(self.node_ids),
        }

    @classmethod
    def from_dict(cls, data: dict) -> Cluster:
        memory = {DeviceId.parse(d["name"]): d["memory_gb"] for d in data["devices"]}
        return cls(memory, data["nodes"], tuple(data.get("node_ids", ())))

    @classmethod
    def from_spec(cls, spec: ClusterSpec) -> Cluster:
        """Devices from the spec; counts left unset are read off this machine."""
        gpus = spec.gpus if spec.gpus is not None else local_gpu_count()
        cpus = cpu_slots(spec)
        cpu_memory = spec.cpu_memory_gb if spec.cpu_memory_gb is not None else local_memory_gb() / max(1, cpus)
        devices: dict[DeviceId, float] = {}
        for kind, total, memory in (("gpu", gpus, gpu_memory_gb(spec)), ("cpu", cpus, cpu_memory)):
            per_node = per_node_of(total, spec.nodes)
            devices.update({DeviceId(i // per_node, kind, i): memory for i in range(total)})
        return cls(devices, spec.nodes)


def per_node_of(total: int, nodes: int) -> int:
    """Devices of a kind on each node, `total` over `nodes` (the last node may have fewer)."""
    return -(-total // nodes) if total else 0


def cpu_slots(spec: ClusterSpec) -> int:
    """CPU slots of the cluster `spec` declares (unset: this machine's cores on each node)."""
    return spec.cpus if spec.cpus is not None else (os.cpu_count() or 1) * spec.nodes


def cpus_per_node(spec: ClusterSpec) -> int:
    """CPU slots on each node of the cluster `spec` declares."""
    return per_node_of(cpu_slots(spec), spec.nodes)


def local_gpu_count() -> int:
    """GPUs visible here, without importing torch: CUDA_VISIBLE_DEVICES, else `nvidia-smi -L`."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([v for v in visible.split(",") if v.strip() and v.strip() != "-1"])
    return sum(1 for line in _nvidia_smi("-L") if line.startswith("GPU "))


def gpu_memory_gb(spec: ClusterSpec) -> float:
    """Memory of each GPU: the spec's, else the smallest of this machine's GPUs, else `DEFAULT_GPU_MEMORY_GB`."""
    if spec.gpu_memory_gb is not None:
        return spec.gpu_memory_gb
    lines = _nvidia_smi("--query-gpu=memory.total", "--format=csv,noheader,nounits")
    mib = [float(line) for line in lines if line.replace(".", "", 1).isdigit()]  # "[N/A]" on some GPUs
    return min(mib) / 1024 if mib else DEFAULT_GPU_MEMORY_GB


def _nvidia_smi(*args: str) -> list[str]:
    """nvidia-smi's output lines, or none where it is missing or fails."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def local_memory_gb() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        return 8.0
