"""A worker replica as the runtime holds it once started, and what its process is built from."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from m2flow.cluster import DeviceId
from m2flow.schedule import ReplicaId


@dataclass
class Replica:
    worker: str
    index: int
    device: DeviceId
    actor: Any  # the handle the controller calls: the host's actor, or a member's handle on a shared process
    process: Any = None  # the actor of the process it runs in (shared by co-hosted replicas)

    @property
    def id(self) -> ReplicaId:
        return ReplicaId(self.worker, self.index)


@dataclass
class HostArgs:
    """What one replica's host is built from, before its process exists."""

    replica: Replica
    args: tuple
    resources: dict[str, float]
    env_vars: dict[str, str]  # the process's own: the GPU a simulator renders on


def worker_env(env_vars: dict[str, str]) -> dict:
    """A worker process's Ray runtime env: `env_vars`, and user modules imported the way the driver does
    (from its working directory too)."""
    paths = [os.getcwd(), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {"env_vars": {"PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)), **env_vars}}
