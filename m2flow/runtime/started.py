"""The processes a launch started, one per replica (its current one), as each said of itself on starting: its
node, pid, start time and imported modules. Whether one runs on the driver's host and is still the process
started there (a pid may be given to another process once it ends), and the beat files of those on this host
(`pulse.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from m2flow.runtime.nodes import addresses
from m2flow.runtime.pulse import Watch, beat_file
from m2flow.schedule import ReplicaId


@dataclass(frozen=True)
class Started:
    """What a replica's process said of itself as it started."""

    node: str  # its Ray node id
    pid: int
    at: float  # its start time: tells it from a later process given its pid
    modules: tuple[str, ...]  # the third-party modules it imported: what a spare for it imports


class StartedProcesses:
    """The current process of every replica a launch started."""

    def __init__(self, output_dir: str):
        self.output_dir = output_dir
        self.of: dict[ReplicaId, Started] = {}
        self._beat_files: dict[ReplicaId, tuple[Path, int]] | None = None  # `watch`'s, once read

    def record(self, replica: ReplicaId, info: dict) -> None:
        """What `replica`'s new process said of itself as it started (`WorkerHost.info`)."""
        self.of[replica] = Started(info["node"], info["pid"], info["started"], tuple(info["modules"]))
        self._beat_files = None  # a new process: read afresh

    @property
    def nodes(self) -> dict[ReplicaId, str]:
        """Each replica's Ray node id."""
        return {replica: started.node for replica, started in self.of.items()}

    @property
    def pids(self) -> dict[ReplicaId, int]:
        """Each replica's process id (on its node)."""
        return {replica: started.pid for replica, started in self.of.items()}

    def on_this_host(self, replica: ReplicaId) -> bool:
        """Whether `replica`'s process runs on the driver's host (its pid means something here)."""
        import ray

        return addresses().get(self.of[replica].node) == ray.util.get_node_ip_address()

    def alive_here(self, replica: ReplicaId) -> bool:
        """Whether `replica`'s process runs on the driver's host and is still the one started for it: only then
        may it be signalled."""
        import psutil

        if not self.on_this_host(replica):
            return False
        started = self.of[replica]
        try:
            return psutil.Process(started.pid).create_time() == started.at
        except psutil.Error:
            return False

    def watch(self, silence_s: float) -> Watch:
        """The beat files of the processes on the driver's host (`pulse.py`)."""
        import ray

        if self._beat_files is None:
            node, address = ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()
            self._beat_files = {
                replica: (beat_file(self.output_dir, address, started.pid), started.pid)
                for replica, started in self.of.items()
                if started.node == node
            }
        return Watch(self._beat_files, silence_s)
