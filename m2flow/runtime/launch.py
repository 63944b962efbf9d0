"""Start what a plan needs on Ray: the cluster connection, one placement-group bundle per device,
one host actor per worker replica, and the worker-to-worker channels of the loop."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from functools import partial
from typing import Any

from m2flow.cluster import DeviceId
from m2flow.context import WorkerContext
from m2flow.errors import PlanError
from m2flow.graph import MacroGraph
from m2flow.kinds import KINDS
from m2flow.planners.processes import same_process
from m2flow.planners.render import render_gpus
from m2flow.planners.threads import replica_cores
from m2flow.runtime.deadlines import Deadlines
from m2flow.runtime.host import MemberHandle, ProcessHost, WorkerHost
from m2flow.runtime.nodes import addresses, driver_node, unreachable
from m2flow.runtime.relocate import Relocator
from m2flow.runtime.replica import HostArgs, Replica, worker_env
from m2flow.runtime.respawn import Respawning
from m2flow.runtime.spares import Spares
from m2flow.runtime.started import StartedProcesses
from m2flow.runtime.waits import Deadline, wait_all
from m2flow.runtime.weight_sync import TRANSPORTS, Route
from m2flow.runtime.wiring import LoopChannels
from m2flow.schedule import Plan, ReplicaId
from m2flow.spec import Edge
from m2flow.transfer import Transport, mapping_kept

log = logging.getLogger(__name__)

NODE_ID_LABEL = "ray.io/node-id"  # Ray's default label on every node


class Launch(Respawning):
    """The actors and channels of one plan; `close()` releases everything. New processes for its replicas
    once it runs: `Respawning`."""

    def __init__(self, graph: MacroGraph, plan: Plan, output_dir: str, quarantined: Mapping[int, int] | None = None):
        self.graph = graph
        self.plan = plan
        self.output_dir = output_dir
        self.quarantined = {} if quarantined is None else quarantined  # env -> times, read as replicas start
        self.timeouts = graph.spec.run.timeouts
        self.deadlines = Deadlines.from_plan(plan, self.timeouts)  # collectives wait no longer than their phase
        self.replicas: dict[str, list[Replica]] = {}
        self.processes = StartedProcesses(output_dir)
        self.pg = None
        self.bundle_of: dict[DeviceId, int] = {}
        self.rendezvous: dict[str, dict | None] = {}
        self.transports: dict[Edge, Transport] = {}
        # what a replacement needs: the loop's channels, its sync routes
        self.channels: LoopChannels | None = None
        self.sync_setup: dict[ReplicaId, dict[Edge, tuple[str, Route | None]]] = {}  # edge -> (method, route)
        self.generation: dict[ReplicaId, int] = {}  # processes a replica has had before its current one
        self.spares = Spares(self._spare)
        self.from_spare: set[ReplicaId] = set()  # replicas whose current process was a spare
        # the replicas started off their planned device, its node lost (`relocate.py`)
        self.relocator = Relocator(
            plan.cluster, sorted(plan.occupants()), self.deadlines.reach_s, unreachable, driver_node(), _address
        )

    def start(self) -> None:
        """Reserve the plan's devices, start a host per replica (or per shared process), wait until every
        worker is built, check each runs where the plan put it, connect the loop's channels, and give each
        sync edge's replicas their transport (its group, if any, meets)."""
        self.transports = {sync.edge: self.plan.transports[str(sync.edge)] for sync in self.graph.sync}
        self._reserve_devices()
        self.rendezvous = {name: self._rendezvous(name) for name in self.plan.placements}
        self.render_on = render_gpus(self.graph, self.plan)
        hosts = [self._host_args(name, r) for name in self.plan.placements for r in range(self._replicas(name))]
        self._start_hosts(hosts)
        self._await_start()
        self._check_nodes()
        self._wire_loop()
        self._route_syncs()

    def _replicas(self, name: str) -> int:
        return len(self.plan.placements[name].replica_devices)

    def _reserve_devices(self) -> None:
        """One placement-group bundle per device the plan uses, pinned to the node the plan chose."""
        import ray
        from ray.util.placement_group import placement_group

        cluster = self.plan.cluster
        used = sorted(self.plan.occupants())
        self.bundle_of = {device: i for i, device in enumerate(used)}
        bundles = [{"GPU": 1} if d.kind == "gpu" else {"CPU": 1} for d in used]
        selectors = [{NODE_ID_LABEL: cluster.node_ids[d.node]} for d in used] if cluster.node_ids else None
        self.pg = placement_group(
            bundles, strategy="PACK", name=f"m2flow-{self.plan.workflow}", bundle_label_selector=selectors
        )
        try:
            ray.get(self.pg.ready(), timeout=self.timeouts.start_s)
        except ray.exceptions.GetTimeoutError:
            raise PlanError(
                f"Ray could not reserve {len(bundles)} device bundles {bundles} within {self.timeouts.start_s:g}s;"
                f" the cluster has {ray.available_resources()}. Lower replicas or set cluster.cpus/gpus to what"
                " Ray has"
            ) from None

    def device_of(self, replica: ReplicaId) -> DeviceId:
        """Where `replica` runs: its planned device, or the core it borrowed when that device's node was lost."""
        return self.relocator.device_of(replica, self.plan.device_of(replica))

    def _host_args(self, name: str, r: int) -> HostArgs:
        """Replica `r` of worker `name`: its context, its share of its device (none on a borrowed one: its
        occupants hold it whole), its host's arguments."""
        info = self.graph.info[name]
        device = self.device_of(ReplicaId(name, r))
        share = 0.0 if ReplicaId(name, r) in self.relocator.moves else _share(self.plan.occupants()[device])
        resources = {"num_gpus": share, "num_cpus": 0} if device.kind == "gpu" else {"num_cpus": share}
        items = info.items_per_replica
        ctx = WorkerContext(
            worker=name,
            kind=info.kind,
            replica=r,
            replicas=info.replicas,
            items=(r * items, (r + 1) * items),
            seed=self.graph.spec.run.seed,
            device="cuda" if device.kind == "gpu" else "cpu",
            backend=info.spec.backend,
            output_dir=self.output_dir,
            iterations=self.graph.spec.run.iterations,
            quarantined=dict(self.quarantined),
            gpu_memory_gb=self.plan.memory_gb(ReplicaId(name, r)),
            threads=len(self._computes_on(ReplicaId(name, r), device)),
            # a rank's own collective timeout is the backstop, twice the training call's deadline, so the
            # controller's deadline passes first and names the ranks; should measured costs later raise that
            # deadline past it (`Controller.adopt`), the rank's own timeout reports a hang first
            collective_s=self.deadlines.collective_s,
        )
        instances = self.plan.pipeline_stages if KINDS[info.kind].slices else 1
        rendezvous = self.rendezvous[name]
        dist = None if rendezvous is None else {**rendezvous, "meet_s": self.timeouts.start_s}
        args = (info.target, info.spec.args, ctx, instances, dist, self._pinned(ReplicaId(name, r), device))
        render = self._render_gpu(ReplicaId(name, r))
        env_vars = {}
        # a GPU-placed simulator sees only its own GPU (Ray sets CUDA_VISIBLE_DEVICES; EGL lists that one); a
        # MUJOCO_EGL_DEVICE_ID set by the user is left alone
        if render is not None and device.kind == "cpu" and "MUJOCO_EGL_DEVICE_ID" not in os.environ:
            # MuJoCo's EGL device index: the GPU's position on its host, in the order the driver lists them
            env_vars["MUJOCO_EGL_DEVICE_ID"] = str(self.plan.cluster.on_node(render))
        return HostArgs(Replica(name, r, device, None), args, resources, env_vars)

    def _render_gpu(self, replica: ReplicaId) -> DeviceId | None:
        """The GPU a simulator replica renders on: the plan's; for one moved off a lost node, the first GPU its
        borrowed node's simulators render on, else that node's first GPU (None where it has none)."""
        move = self.relocator.moves.get(replica)
        if move is None:
            return self.render_on.get(replica)
        node = move.borrowed.node
        rendering = sorted({gpu for gpu in self.render_on.values() if gpu.node == node})
        return (rendering or [gpu for gpu in self.plan.cluster.of_kind("gpu") if gpu.node == node] or [None])[0]

    def _start_hosts(self, hosts: list[HostArgs]) -> None:
        """A `WorkerHost` actor per replica; replicas the plan co-hosts share one `ProcessHost` actor."""
        together = same_process(self.plan.processes)
        shared: dict[int, list[HostArgs]] = {}
        for host in hosts:
            replica = host.replica
            self.replicas.setdefault(replica.worker, []).append(replica)
            if replica.id in together:
                shared.setdefault(together[replica.id], []).append(host)
            else:
                label, env = f"{replica.worker}:{replica.index}", worker_env(host.env_vars)
                replica.actor = replica.process = self._actor(
                    WorkerHost, label, replica.device, env, host.resources, *host.args
                )
        for members in shared.values():
            label = "+".join(f"{m.replica.worker}:{m.replica.index}" for m in members)
            resources = {key: sum(m.resources[key] for m in members) for key in members[0].resources}
            first = members[0].replica
            env = worker_env({k: v for m in members for k, v in m.env_vars.items()})  # the simulator's, if any
            process = self._actor(ProcessHost, label, first.device, env, resources, [m.args for m in members])
            for member in members:
                member.replica.process = process
                member.replica.actor = MemberHandle(process, member.replica.worker)

    def _await_start(self) -> None:
        members = [r for g in self.replicas.values() for r in g]
        infos = wait_all(
            [(r.actor.info.remote(), r, "start-up") for r in members],
            Deadline(self.timeouts.start_s, "workers to start (import, build model, init process groups)"),
        )
        for replica, info in zip(members, infos, strict=True):
            self.processes.record(replica.id, info)

    def _actor(self, host: type, label: str, device: DeviceId, env: dict, resources: dict, *args: Any) -> Any:
        """A host actor named `m2flow:<workflow>:<label>`, in the plan's bundle for its device."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return (
            ray.remote(host)
            .options(
                name=f"m2flow:{self.plan.workflow}:{label}",
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self.pg, placement_group_bundle_index=self.bundle_of[device]
                ),
                runtime_env=env,
                **resources,
            )
            .remote(*args)
        )

    def _check_nodes(self) -> None:
        """The plan's node assignment is what runs: every replica is on the node its device belongs to."""
        node_ids = self.plan.cluster.node_ids
        if not node_ids:
            return
        for replica, node in self.processes.nodes.items():
            device = self.device_of(replica)
            if node != node_ids[device.node]:
                raise PlanError(
                    f"Ray started {replica} on node {node[:8]}, the plan put it on node"
                    f" {device.node} ({node_ids[device.node][:8]}); the cluster changed since planning?"
                )

    def _computes_on(self, replica: ReplicaId, device: DeviceId) -> list[DeviceId]:
        """The devices `replica`, on `device`, computes on: its block of its node's cores where it computes on
        several (`resources.threads`), else `device` (a GPU, or a core borrowed after a node was lost)."""
        if device.kind != "cpu" or device != self.plan.device_of(replica):
            return [device]
        return replica_cores(self.graph, self.plan, replica)

    def _pinned(self, replica: ReplicaId, device: DeviceId) -> list[int] | None:
        """The node-local cores a CPU-placed replica is pinned to, so shared CPU slots really are shared (None:
        not pinned, a GPU replica or `placement.pin_cpus: false`)."""
        if device.kind != "cpu" or not self.graph.spec.placement.pin_cpus:
            return None
        return [self.plan.cluster.on_node(core) for core in self._computes_on(replica, device)]

    def _rendezvous(self, name: str) -> dict | None:
        """Process-group rendezvous for a multi-rank group worker (None for any other)."""
        info = self.graph.info[name]
        if not info.group or info.replicas < 2:
            return None
        return self._rendezvous_at(self.device_of(ReplicaId(name, 0)), f"workers.{name}")

    def _rendezvous_at(self, device: DeviceId, what: str) -> dict:
        """Rank 0's node address and a port free there: found here when that node is this one, else by a
        task placed in rank 0's bundle (so it holds on any node of the cluster)."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        node_ids = self.plan.cluster.node_ids
        if node_ids and node_ids[device.node] == driver_node():  # (a Ray client's driver runs elsewhere)
            return _rendezvous_point()  # no process to start for it (a task's takes a second)

        task = ray.remote(_rendezvous_point).options(
            num_cpus=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                self.pg, placement_group_bundle_index=self.bundle_of[device]
            ),
        )
        try:
            return ray.get(task.remote(), timeout=self.timeouts.start_s)
        except ray.exceptions.GetTimeoutError:
            raise PlanError(
                f"{what}: no rendezvous point on rank 0's node within {self.timeouts.start_s:g}s"
                " (run.timeouts.start_s); is that node still in the cluster?"
            ) from None

    def _route_syncs(self) -> None:
        """Give each sync edge's replicas their end of its transport, all at once (a group meets now). Every
        replica sees the edges in one order, so groups meet in turn."""
        calls = [call for sync in self.graph.sync for call in self._connect_edge(sync.edge)]
        wait_all(calls, Deadline(self.timeouts.start_s, "sync edges to start (their groups to meet)"))

    def _connect_edge(self, edge: Edge) -> list[tuple[Any, Replica, str]]:
        """The calls that give every replica of sync `edge` its end (a group meets at a new rendezvous): the
        source's first replica publishes (rank 0 of a group), its other replicas' outputs are dropped, every
        destination replica its port's dispatch sends the state to receives (`WorkerInfo.state_receivers`)."""
        transport = self.transports[edge]
        receivers = self.graph.info[edge.dst.worker].state_receivers(edge.dst.port)
        sources, targets = self.replicas[edge.src.worker], [self.replicas[edge.dst.worker][r] for r in receivers]
        meet = self._rendezvous_at(sources[0].device, f"sync {edge}") if TRANSPORTS[transport].meets else {}
        timeouts = {"timeout_s": 2 * self.deadlines.sync(str(edge)), "meet_s": self.timeouts.start_s}
        keep = mapping_kept(self.plan, edge.src.worker)
        route = partial(Route, transport, world=len(targets) + 1, edge=str(edge), keep_mapping=keep, **timeouts, **meet)
        setup = [(r, "set_source", route(rank=0) if r.index == 0 else None) for r in sources]
        setup += [(r, "set_target", route(rank=rank)) for rank, r in enumerate(targets, start=1)]
        calls = []
        for r, method, end in setup:
            self.sync_setup.setdefault(r.id, {})[edge] = (method, end)
            calls.append((getattr(r.actor, method).remote(str(edge), end), r, f"sync {edge}: start"))
        return calls

    def _wire_loop(self) -> None:
        if self.graph.loop is None:
            return
        self.channels = LoopChannels(self.graph, self.plan, self.timeouts.start_s)
        self.channels.wire([r for w in self.graph.loop.workers for r in self.replicas[w]])

    def own_processes(self, worker: str) -> bool:
        """Whether each replica of `worker` runs in a process of its own."""
        return not any(isinstance(r.actor, MemberHandle) for r in self.replicas[worker])

    def _replica(self, replica: ReplicaId) -> Replica:
        return self.replicas[replica.worker][replica.replica]

    def close(self) -> None:
        import ray

        for process in {id(r.process): r.process for g in self.replicas.values() for r in g}.values():
            ray.kill(process, no_restart=True)
        self.spares.close()
        if self.pg is not None:
            ray.util.remove_placement_group(self.pg)
        self.replicas.clear()


def _rendezvous_point() -> dict:
    from m2flow.runtime.channels import node_ip
    from m2flow.runtime.distributed import free_port

    return {"address": node_ip(), "port": free_port()}


def replica_process(workflow: str, replica: str) -> Any:
    """The Ray actor (the process) hosting `replica` ("env:0") of a running workflow, alone or co-hosted
    with others (`placement.colocate`): for fault injection and inspection. A replacement that runs in a
    spare process (`run.spares`) is not found by its name: `<run>/processes.json` has its pid."""
    import ray

    prefix = f"m2flow:{workflow}:"
    for name in ray.util.list_named_actors():
        hosted = [label.split("#")[0] for label in name.removeprefix(prefix).split("+")]  # "#n": a replacement
        if name.startswith(prefix) and replica in hosted:
            return ray.get_actor(name)
    raise ValueError(f"no running process hosts {replica} of workflow {workflow}")


def _share(occupants: int) -> float:
    """Fraction of one device per replica, floored to Ray's 1e-4 resource precision."""
    return max(1e-4, int(10_000 / occupants) / 10_000)


def _address(node: str) -> str:
    """A Ray node's address (its id where Ray no longer lists it)."""
    return addresses().get(node, node)
