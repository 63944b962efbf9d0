"""The devices a plan places workers on: GPUs, and CPU slots (one per core) for CPU work."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import asdict, dataclass
from typing import Literal

from m2flow.spec import ClusterSpec

DeviceKind = Literal["gpu", "cpu"]


@dataclass(frozen=True)
class Device:
    index: int
    kind: DeviceKind
    node: int
    memory_gb: float

    @property
    def name(self) -> str:
        return f"n{self.node}/{self.kind}{self.index}"


@dataclass(frozen=True)
class Cluster:
    devices: tuple[Device, ...]
    nodes: int
    node_ids: tuple[str, ...] = ()  # Ray's id of each node, when planned on a live Ray cluster

    def of_kind(self, kind: DeviceKind) -> list[Device]:
        return [d for d in self.devices if d.kind == kind]

    def count(self, kind: DeviceKind) -> int:
        return sum(1 for d in self.devices if d.kind == kind)

    def to_dict(self) -> dict:
        return {"nodes": self.nodes, "devices": [asdict(d) for d in self.devices], "node_ids": list(self.node_ids)}

    @classmethod
    def from_dict(cls, data: dict) -> Cluster:
        return cls(tuple(Device(**d) for d in data["devices"]), data["nodes"], tuple(data.get("node_ids", ())))

    @classmethod
    def from_spec(cls, spec: ClusterSpec) -> Cluster:
        """Devices from the spec; counts left unset are read off this machine."""
        gpus = spec.gpus if spec.gpus is not None else local_gpu_count()
        cpus = spec.cpus if spec.cpus is not None else (os.cpu_count() or 1) * spec.nodes
        cpu_memory = spec.cpu_memory_gb if spec.cpu_memory_gb is not None else local_memory_gb() / max(1, cpus)
        devices = []
        for kind, total, memory in (("gpu", gpus, spec.gpu_memory_gb), ("cpu", cpus, cpu_memory)):
            per_node = -(-total // spec.nodes) if total else 0
            devices += [Device(i, kind, i // per_node, memory) for i in range(total)]
        return cls(tuple(devices), spec.nodes)


def local_gpu_count() -> int:
    """GPUs visible here, without importing torch: CUDA_VISIBLE_DEVICES, else `nvidia-smi -L`."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([v for v in visible.split(",") if v.strip() and v.strip() != "-1"])
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def local_memory_gb() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        return 8.0
