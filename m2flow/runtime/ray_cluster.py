"""The Ray cluster a run starts or joins, and the devices it has as m2flow plans on them: per node its GPUs,
then one CPU slot per core."""

from __future__ import annotations

import logging
import os
import socket

from m2flow.cluster import Cluster, DeviceId, gpu_memory_gb
from m2flow.errors import SpecError
from m2flow.runtime.nodes import driver_node
from m2flow.spec import ClusterSpec

NICENESS = "RAY_worker_niceness"  # how much a Ray worker lowers its priority as it starts
PROBE_S = 10.0  # how long a cluster's address has to accept a connection


def connect_ray(spec: ClusterSpec) -> Cluster:
    """Join `cluster.address` or start a local Ray (dashboard off); return the cluster to plan on."""
    import ray

    if not ray.is_initialized():
        os.environ.setdefault("RAY_DEDUP_LOGS", "0")
        # a call given up after another failed (a restart, a stop) still ends in an error no one reads: m2flow has
        # named the failure that mattered, and Ray's late "Unhandled error" dump after it would bury that
        os.environ.setdefault("RAY_IGNORE_UNHANDLED_ERRORS", "1")
        # Ray's workers lower their priority by 15 as they start, to keep Ray's own daemons responsive; m2flow's
        # workers are the job: at nice 15 any other busy process on the machine starves them (a training worker
        # took over 180 s to start beside two CPU-bound processes on 2 cores). Each worker reads this variable
        # from the environment it inherits: a local Ray's from this process, a cluster's from the job's.
        os.environ.setdefault(NICENESS, "0")
        if spec.address:
            _answering(spec.address)
            runtime_env = {"env_vars": {NICENESS: os.environ[NICENESS]}}
            try:
                ray.init(
                    address=spec.address,
                    include_dashboard=False,
                    logging_level=logging.WARNING,
                    runtime_env=runtime_env,
                )
            except ConnectionError as exc:
                raise SpecError(
                    [f"cluster.address: {spec.address}: {exc}; start Ray there or fix the address"]
                ) from None
        else:
            local = Cluster.from_spec(spec)
            ray.init(
                address="local",  # a new local Ray even where a `ray start` cluster is recorded
                num_cpus=local.count("cpu"),
                num_gpus=local.count("gpu"),
                include_dashboard=False,
                logging_level=logging.WARNING,
                log_to_driver=True,
            )
    if spec.address or spec.gpus is None or spec.cpus is None:
        return cluster_from_ray(spec)
    return Cluster.from_spec(spec)


def _answering(address: str) -> None:
    """A `host:port` address (or `ray://host:port`) must accept a connection within `PROBE_S`: Ray's own join
    retries for minutes where nothing listens. `auto` is Ray's to find."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    host = host.removeprefix("[").removesuffix("]")  # an IPv6 host as an address writes it: [::1]:6379
    if not host or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=PROBE_S).close()
    except OSError as exc:
        raise SpecError(
            [
                f"cluster.address: nothing answers at {address} ({exc.strerror or exc}) within {PROBE_S:g}s;"
                " start the cluster there (`ray start --head`) or fix the address"
            ]
        ) from None


def cluster_from_ray(spec: ClusterSpec, without: frozenset[str] = frozenset()) -> Cluster:
    """The devices Ray reports, node by node (GPUs, then one CPU slot per core), but for the nodes (Ray
    node ids) `without`. Node 0 is the driver's, the others follow in Ray's order, so that device indices
    (`placement.devices`) count the driver's host's devices first."""
    import ray

    here = driver_node()
    nodes = [n for n in ray.nodes() if n.get("Alive") and n["NodeID"] not in without]
    nodes.sort(key=lambda node: node["NodeID"] != here)  # stable: Ray's order after the driver's node
    devices: dict[DeviceId, float] = {}
    for kind, key, memory in (("gpu", "GPU", gpu_memory_gb(spec)), ("cpu", "CPU", None)):
        index = 0
        for node_index, node in enumerate(nodes):
            count = int(node["Resources"].get(key, 0))
            if kind == "cpu" and spec.cpus is not None:
                count = min(count, spec.cpus)
            cpu_mem = spec.cpu_memory_gb or node["Resources"].get("memory", 8 * 2**30) / 2**30 / max(1, count)
            for _ in range(count):
                devices[DeviceId(node_index, kind, index)] = memory or cpu_mem
                index += 1
    return Cluster(devices, len(nodes), tuple(n["NodeID"] for n in nodes))
