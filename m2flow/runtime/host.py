"""The Ray actor that hosts one replica of a user's worker and runs its part of the plan.

The user's class stays plain: the host builds it under a `WorkerContext`, calls its ports when the
controller or the loop program says so, calls the optional hooks it defines (`state_dict`,
`load_state_dict`, `load_statistics`, `metrics`, `offload`, `onload`), and reports every task for the trace.
A simulator replica hosts one instance per pipeline slice; other workers one instance.
`ProcessHost` hosts several replicas in one process (`placement.colocate`).
"""

from __future__ import annotations

import inspect
import os
import sys
import time
import traceback
from typing import Any

from m2flow.context import WorkerContext, set_context
from m2flow.errors import EnvFailed, WorkerError
from m2flow.runtime.batching import leading_size, payload_bytes
from m2flow.runtime.channels import Mailbox, PeerId
from m2flow.runtime.crashes import record_here
from m2flow.runtime.gpu_memory import cap_gpu_memory, out_of_share
from m2flow.runtime.loop import LoopProgram, LoopStats, Member, run_loop
from m2flow.runtime.pulse import beat_while_alive
from m2flow.runtime.stacks import answer_when_asked
from m2flow.runtime.tracing import TaskEvent
from m2flow.runtime.weight_sync import Route, StateManifest, SyncTransport, transport_for
from m2flow.sharding import slice_sizes


class PortFailed(WorkerError):
    """A user port raised; carries the worker, replica, port, the original traceback and, when a simulator
    named it (`m2flow.EnvFailed`), the env that failed."""

    def __init__(self, worker: str, replica: int, port: str, where: str, detail: str, env: int | None = None):
        self.worker, self.replica, self.port, self.env = worker, replica, port, env
        super().__init__(f"worker '{worker}' replica {replica} failed in port '{port}' ({where}):\n{detail}")

    def headline(self) -> str:
        """Where it failed and the exception it raised, on one line."""
        lines = [line for line in str(self).splitlines() if line.strip()]
        return f"{lines[0]} {lines[-1].strip()}"

    def __reduce__(self):
        return (_rebuild_port_failed, (self.args[0], self.worker, self.replica, self.port, self.env))


def headline(exc: Exception) -> str:
    """A failure on one line: where a port failed and what it raised, or the first line of any other."""
    if isinstance(exc, PortFailed):
        return exc.headline()
    return str(exc).splitlines()[0]


def _rebuild_port_failed(message: str, worker: str, replica: int, port: str, env: int | None) -> PortFailed:
    error = PortFailed.__new__(PortFailed)
    WorkerError.__init__(error, message)
    error.worker, error.replica, error.port, error.env = worker, replica, port, env
    return error


def compute_on(threads: int) -> None:
    """Torch's intra-op threads: one per core the replica computes on (Ray starts its process with one)."""
    import torch

    torch.set_num_threads(threads)


class _FunctionWorker:
    """A plain function as a worker with the single port `call`."""

    def __init__(self, func):
        self.func = func

    def call(self, *args):
        return self.func(*args)


class WorkerHost:
    def __init__(
        self,
        target: Any,
        args: dict,
        ctx: WorkerContext,
        instances: int,
        dist: dict | None,
        cores: list[int] | None = None,
    ):
        threads = ctx.threads
        if cores is not None:  # the node's slots as this process may use its cores (fewer in a cpuset)
            allowed = sorted(os.sched_getaffinity(0))
            pinned = {allowed[core % len(allowed)] for core in cores}
            os.sched_setaffinity(0, pinned)
            threads = min(threads, len(pinned))
        address = _node_address()
        answer_when_asked(ctx.output_dir, address)
        beat_while_alive(ctx.output_dir, address)
        record_here(ctx.output_dir, address)
        self.ctx = ctx
        self.me: PeerId = (ctx.worker, ctx.replica)
        self.mailbox: Mailbox | None = None
        self.publishers: dict[str, SyncTransport | None] = {}  # by sync edge: None on a source's other replicas
        self.receivers: dict[str, SyncTransport] = {}  # by sync edge
        if ctx.gpu_memory_gb is not None:
            cap_gpu_memory(ctx.gpu_memory_gb)
        if dist is not None:
            from m2flow.runtime.distributed import init_process_group

            init_process_group(ctx, dist["address"], dist["port"], dist["meet_s"])
        self.instances = [self._build(target, args, ctx, s, instances) for s in range(instances)]
        if threads > 1:
            compute_on(threads)

    @staticmethod
    def _build(target: Any, args: dict, ctx: WorkerContext, stage: int, stages: int) -> Any:
        first, last = ctx.items
        per = slice_sizes(last - first, stages)
        start = first + sum(per[:stage])
        instance_ctx = ctx.with_(stage=stage, stages=stages, items=(start, start + per[stage]), replica_items=ctx.items)
        set_context(instance_ctx)
        try:
            if inspect.isclass(target):
                return target(**args)
            return _FunctionWorker(target)
        except Exception as exc:
            own = traceback.format_exception(type(exc), exc, exc.__traceback__.tb_next)  # from the worker's code on
            detail = "".join(own) + out_of_share(ctx, exc)
            raise PortFailed(ctx.worker, ctx.replica, "__init__", "construction", detail) from None

    def info(self) -> dict:
        import psutil
        import ray

        me = psutil.Process()
        node = ray.get_runtime_context().get_node_id()
        return {"pid": me.pid, "started": me.create_time(), "node": node, "modules": imported_modules()}

    # -- channels ----------------------------------------------------------------------------
    def open_channels(self, authkey: bytes, kinds: list[str]) -> dict:
        self.mailbox = Mailbox(self.me, authkey, kinds)
        return self.mailbox.addresses

    def connect(self, peers: list[tuple[PeerId, Any]], timeout_s: float) -> None:
        for peer, address in peers:
            self.mailbox.connect(tuple(peer), address, timeout_s)

    def await_peers(self, peers: list[PeerId], timeout_s: float) -> None:
        self.mailbox.wait_inbound([tuple(p) for p in peers], timeout_s)

    def forget_peer(self, peer: PeerId) -> None:
        self.mailbox.forget(tuple(peer))

    # -- phases --------------------------------------------------------------------------------
    def run_loop(self, program: LoopProgram) -> dict[str, LoopStats]:
        """Stats by worker name (one here; several in a `ProcessHost`)."""
        return {self.ctx.worker: run_loop(program, [self.member(program)])[0]}

    def member(self, program: LoopProgram) -> Member:
        """This replica as a member of a loop program (its ports, its channels)."""

        instances, ctx = self.instances, self.ctx

        def call_port(port: str, stage: int, value: Any) -> Any:  # the hot path: no work unless it fails
            method = getattr(instances[stage % len(instances)], port)
            try:
                return method() if value is None else method(value)
            except Exception as exc:
                raise _failed(ctx, port, f"iteration {program.iteration}, loop slice {stage}", exc) from None

        return Member(self.ctx.worker, self.ctx.replica, call_port, self.mailbox)

    def call(self, port: str, iteration: int, counts: list[int], *outputs: list[Any]) -> tuple[list[Any], TaskEvent]:
        """Call `port` on every instance. `outputs` are the producer replicas' output lists (one item per
        producer instance), `counts[i]` of them for the i-th input edge; each argument the port receives is
        the flat list of the shards this replica was given."""
        args, at = [], 0
        for count in counts:
            args.append([item for produced in outputs[at : at + count] for item in produced])
            at += count
        start = time.time()
        outputs = [self._invoke(inst, port, args, f"iteration {iteration}") for inst in self.instances]
        items = sum(leading_size(a) for arg in args for a in arg) if args else 0
        return outputs, TaskEvent(port, "call", start, time.time(), items=items, bytes=payload_bytes(args))

    # -- sync edges ----------------------------------------------------------------------------
    def set_source(self, edge: str, route: Route | None) -> None:
        """This replica is sync edge `edge`'s source (None: a source replica whose output nobody reads, the
        first replica's stands for the group); meets the edge's group if it has one."""
        self.publishers[edge] = None if route is None else self._connected(edge, route)

    def set_target(self, edge: str, route: Route) -> None:
        """This replica receives sync edge `edge`; meets the edge's group if it has one."""
        self.receivers[edge] = self._connected(edge, route)

    def _connected(self, edge: str, route: Route) -> SyncTransport:
        transport = transport_for(route, self.ctx.device)
        self._guarded(transport.connect, edge, "sync start-up")
        return transport

    def publish_state(self, edge: str, port: str, iteration: int) -> tuple[list[Any], TaskEvent]:
        """Call the sync source `port`; the first replica's output goes out by the edge's transport."""
        start = time.time()
        outputs = [self._invoke(inst, port, (), f"iteration {iteration}, sync") for inst in self.instances]
        transport = self.publishers[edge]
        where = f"iteration {iteration}, publish"
        first = self._guarded(lambda: transport.publish(outputs[0]), edge, where) if transport else None
        return [first] + [None] * (len(outputs) - 1), TaskEvent(port, "call", start, time.time())

    def send_state(self, edge: str, port: str, iteration: int) -> TaskEvent:
        """The source's side of a transfer that needs it (a broadcast) of what `port` last published."""
        start = time.time()
        sent = self._guarded(self.publishers[edge].send, edge, f"iteration {iteration}, send")
        return TaskEvent(f"{port} (send)", "sync", start, time.time(), bytes=sent)

    def copy_state(self, edge: str, port: str, iteration: int, produced: list[Any]) -> tuple[list[Any], TaskEvent]:
        """Call `port` with the first output of the source's replicas (a sync edge copies one state),
        received by the edge's transport."""
        start = time.time()
        where = f"iteration {iteration}, sync"
        message = produced[0]
        value = self._guarded(lambda: self.receivers[edge].receive(message), edge, f"{where}, receive")
        outputs = [self._invoke(inst, port, (value,), where) for inst in self.instances]
        sent = message.nbytes if isinstance(message, StateManifest) else payload_bytes(value)
        return outputs, TaskEvent(port, "sync", start, time.time(), bytes=sent)

    def _guarded(self, work: Any, edge: str, where: str) -> Any:
        """A transport's step; a failure names this replica and the edge."""
        try:
            return work()
        except Exception:
            raise PortFailed(self.ctx.worker, self.ctx.replica, f"sync {edge}", where, traceback.format_exc()) from None

    def swap(self, op: str) -> TaskEvent:
        """`offload` or `onload` every instance (when the class defines it); traced either way. Before an
        offload, what its sync edges keep on the device goes (the instances' offload may then empty the cache)."""
        start = time.time()
        if op == "offload":
            for transport in [*self.publishers.values(), *self.receivers.values()]:
                if transport is not None:
                    transport.forget()
        self.hook(op)
        return TaskEvent(op, "swap", start, time.time())

    def hook(self, name: str, *args: Any) -> list[Any] | None:
        """Call an optional hook on every instance; None where the class does not define it."""
        if not hasattr(self.instances[0], name):
            return None
        return [self._invoke(inst, name, args, f"hook {name}") for inst in self.instances]

    def hook_each(self, name: str, per_instance: list[Any], optional: bool = False) -> list[Any] | None:
        """Call a hook on each instance with its own value; None where an `optional` one is not defined."""
        if optional and not hasattr(self.instances[0], name):
            return None
        if len(per_instance) != len(self.instances):  # saved by a plan with another number of stages
            per_instance = self._resliced(name, per_instance)
        return [
            self._invoke(inst, name, (value,), f"hook {name}")
            for inst, value in zip(self.instances, per_instance, strict=True)
        ]

    def _resliced(self, name: str, per_instance: list[Any]) -> list[Any]:
        """States saved of `len(per_instance)` slices (for `load_state_dict` or `load_statistics`), cut into this
        plan's by the class (`reslice_states`)."""
        cls = type(self.instances[0])
        reslice = getattr(cls, "reslice_states", None)
        if reslice is None:
            detail = (
                f"the checkpoint holds the state of {len(per_instance)} slice(s) of each replica and this plan runs"
                f" {len(self.instances)}; {cls.__name__} defines no reslice_states(states, parts) to cut it otherwise:"
                f" run with placement.pipeline_stages={len(per_instance)}"
            )
            raise PortFailed(self.ctx.worker, self.ctx.replica, name, f"hook {name}", detail)
        try:
            return reslice(per_instance, len(self.instances))
        except Exception as exc:
            raise _failed(self.ctx, "reslice_states", f"hook {name}", exc) from None

    def _invoke(self, instance: Any, port: str, args: tuple | list, where: str) -> Any:
        method = getattr(instance, port)
        try:
            return method(*args)
        except Exception as exc:
            raise _failed(self.ctx, port, where, exc) from None


def imported_modules() -> list[str]:
    """The modules this process imported, in the order it did, but the standard library's and private
    packages' (what a spare process for it imports ahead: `spares.py`)."""
    loaded = [name for name, module in list(sys.modules.items()) if module is not None]  # None: blocked on purpose
    top = {name: name.partition(".")[0] for name in loaded}
    return [name for name, package in top.items() if package not in sys.stdlib_module_names and package[0] != "_"]


def _node_address() -> str:
    import ray

    return ray.util.get_node_ip_address()


def _failed(ctx: WorkerContext, port: str, where: str, exc: Exception) -> PortFailed:
    """A port or hook that raised `exc` (being handled): where, its traceback, and the env it named if it
    raised `m2flow.EnvFailed`."""
    env = exc.env if isinstance(exc, EnvFailed) else None
    detail = traceback.format_exc() + out_of_share(ctx, exc)
    return PortFailed(ctx.worker, ctx.replica, port, where, detail, env)


class ProcessHost:
    """Several worker replicas in one process: each a `WorkerHost` of its own, driven by one loop program
    (their per-step messages are direct calls); every other call is routed to the member it names."""

    def __init__(self, members: list[tuple]):
        self.hosts = {args[2].worker: WorkerHost(*args) for args in members}  # (target, args, ctx, ...) each

    def member(self, worker: str, method: str, *args: Any) -> Any:
        return getattr(self.hosts[worker], method)(*args)

    def info(self) -> dict:
        return next(iter(self.hosts.values())).info()

    def run_loop(self, program: LoopProgram) -> dict[str, LoopStats]:
        stats = run_loop(program, [host.member(program) for host in self.hosts.values()])
        return dict(zip(self.hosts, stats, strict=True))


class MemberHandle:
    """The controller's handle on one member of a `ProcessHost`: `handle.call.options(...).remote(...)`
    reaches that member's `WorkerHost.call`, as an actor handle would reach a host of its own."""

    def __init__(self, process: Any, worker: str):
        self.process, self.worker = process, worker

    def __getattr__(self, method: str) -> _MemberMethod:
        return _MemberMethod(self.process, self.worker, method, {})


class _MemberMethod:
    def __init__(self, process: Any, worker: str, method: str, options: dict):
        self.process, self.worker, self.method, self._options = process, worker, method, options

    def options(self, **options: Any) -> _MemberMethod:
        return _MemberMethod(self.process, self.worker, self.method, {**self._options, **options})

    def remote(self, *args: Any) -> Any:
        return self.process.member.options(**self._options).remote(self.worker, self.method, *args)
