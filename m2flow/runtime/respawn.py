"""New processes for the replicas of a running launch: a replacement in place where a replica ran (or on
the core it borrowed when its node was lost, `relocate.py`), a training worker restarted whole, and the spare
processes started ahead for them (`spares.py`). Each new process is built as at start, its loop channels
wired to the same peers and its sync routes set again (a group meets anew).

Which replicas may be replaced, and when, is `replace.py`'s (`Replacer`); this module starts their processes.
`Respawning` is `Launch`'s second half: it reads what start-up recorded (the replicas, their processes,
the sync routes, the channels) and builds hosts the way start-up does (`_host_args`, `_actor`)."""

from __future__ import annotations

import contextlib
import os
import signal
from typing import TYPE_CHECKING, Any

from m2flow.cluster import DeviceId
from m2flow.runtime.host import MemberHandle, WorkerHost
from m2flow.runtime.replica import HostArgs, Replica, worker_env
from m2flow.runtime.spares import SpareHost, SpareKey
from m2flow.runtime.waits import Deadline, died, wait_all
from m2flow.runtime.weight_sync import TRANSPORTS
from m2flow.schedule import ReplicaId

if TYPE_CHECKING:
    from m2flow.runtime.launch import Launch


class Respawning:
    """Replacement and restart of a `Launch`'s replicas (module doc)."""

    def restart_worker(self: Launch, worker: str) -> list[Replica]:
        """Every replica of `worker` in a new process, as `replace` does, on its planned device; a process
        group meets again, at a new rendezvous. A rank whose node is gone fails the restart: the run
        restarts and re-plans without the node (`relocate.py`)."""
        ranks = {r.id: self.device_of(r.id) for r in self.replicas[worker]}
        self.relocator.move(ranks, self._running(), lambda *_: "a training worker moves only by a re-plan")
        if self.rendezvous.get(worker):
            self.rendezvous[worker] = self._rendezvous(worker)
        return self.replace(list(ranks))

    def replaceable(self: Launch, replica: ReplicaId) -> str | None:
        """Why `replica` cannot be replaced in place (None: it can): it must run in a process of its own and
        not be a rank of its worker's process group (the other ranks hold their part of its state)."""
        if isinstance(self._replica(replica).actor, MemberHandle):
            return f"{replica} shares its process with other workers (placement.colocate)"
        if self.rendezvous.get(replica.worker):
            return f"{replica} is a rank of '{replica.worker}''s process group"
        return None

    def relocate(self: Launch, replicas: list[ReplicaId]) -> None:
        """Before `replace`: each of `replicas` whose node no longer answers borrows a core on a node left,
        or a WorkerError says why it cannot (`relocate.py`)."""
        self.relocator.move({r: self.device_of(r) for r in replicas}, self._running())

    def _running(self: Launch) -> dict[ReplicaId, DeviceId]:
        return {r.id: self.device_of(r.id) for group in self.replicas.values() for r in group}

    def replace(self: Launch, replicas: list[ReplicaId]) -> list[Replica]:
        """A new process for each of `replicas` where it ran (its planned device, or the core it borrowed
        when `relocate` found that device's node lost), the old one killed if it still runs. Each is built as
        at start but for the envs quarantined since, its channels wired to the same peers and its sync routes
        set as at start; a sync edge whose group meets meets again, the new processes in it (every other
        member's meeting is queued behind its calls in flight: those must end within `run.timeouts.start_s`,
        as a broadcast does once its lost members are killed)."""
        import ray

        fresh, starting, hosts = [], [], []
        for replica in replicas:
            old = self._replica(replica)
            if self.processes.alive_here(replica):  # at once, also when stopped: its share is freed for the new one
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.processes.of[replica].pid, signal.SIGKILL)
            ray.kill(old.process, no_restart=True)
            host = self._host_args(replica.worker, replica.replica)
            new = Replica(old.worker, old.index, host.replica.device, None)
            spare = self.spares.take(self._spare_key(host)) if new.device.kind == "cpu" else None
            if spare is not None:  # started ahead: it builds the worker now
                new.actor = new.process = spare
                starting.append((spare.become.remote(*host.args), new, "start-up"))
                self.from_spare.add(replica)
            else:
                starting.append(self._fresh_host(new, host))
            self.replicas[replica.worker][replica.replica] = new
            fresh.append(new)
            hosts.append(host)
        names = ", ".join(str(r) for r in replicas)
        deadline = Deadline(self.timeouts.start_s, f"the replacement of {names} to start")
        for i, (new, host) in enumerate(zip(fresh, hosts, strict=True)):
            if new.id in self.from_spare and died(starting[i][0], deadline):  # a spare is never worse than none
                starting[i] = self._fresh_host(new, host)
        for new, info in zip(fresh, wait_all(starting, deadline), strict=True):
            self.processes.record(new.id, info)
        looped = [new for new in fresh if self.channels is not None and new.id in self.channels.addresses]
        if looped:
            self.channels.rewire(looped, {r.id: r for group in self.replicas.values() for r in group})
        self._reroute(fresh, names)
        return fresh

    def _fresh_host(self: Launch, new: Replica, host: HostArgs) -> tuple[Any, Replica, str]:
        """A new process for `new`, as at start (under a name of its own: the old one may not be released
        yet); the call that ends once it has started."""
        self.from_spare.discard(new.id)
        self.generation[new.id] = generation = self.generation.get(new.id, 0) + 1
        label = f"{new.worker}:{new.index}#{generation}"
        env = worker_env(host.env_vars)
        new.actor = new.process = self._actor(WorkerHost, label, new.device, env, host.resources, *host.args)
        return new.actor.info.remote(), new, "start-up"

    def stand_by(self: Launch, replicas: list[ReplicaId]) -> None:
        """Spare processes for these replicas' replacements (`spares.py`), those on CPU cores: one per worker,
        node and process environment, or one per rank there for a worker whose ranks restart together."""
        wanted: dict[SpareKey, int] = {}
        for r in replicas:
            if self._replica(r).device.kind == "cpu":
                key = self._spare_key(self._host_args(r.worker, r.replica))
                wanted[key] = wanted.get(key, 0) + 1 if self.rendezvous.get(r.worker) else 1
        self.spares.stand_by(wanted)

    def _spare_key(self: Launch, host: HostArgs) -> SpareKey:
        device = host.replica.device
        return SpareKey(host.replica.worker, device.node, tuple(sorted(host.env_vars.items())), bundle=device)

    def _spare(self: Launch, key: SpareKey, number: int) -> Any:
        """A spare process for `key`, in a bundle on its node, holding no share of it; it imports the
        third-party modules the worker's processes imported (not the worker's package nor m2flow: a module
        of those may set thread-local state as it is imported, and they import quickly)."""
        own = {"m2flow", self.graph.workers[key.worker].cls.partition(".")[0]}
        imported = (m for r, started in self.processes.of.items() if r.worker == key.worker for m in started.modules)
        modules = list(dict.fromkeys(m for m in imported if m.partition(".")[0] not in own))
        env = worker_env(dict(key.env))
        return self._actor(SpareHost, f"spare:{key.worker}:{number}", key.bundle, env, {"num_cpus": 0}, modules)

    def _reroute(self: Launch, fresh: list[Replica], names: str) -> None:
        """The sync routes of new processes: their own end, or every member's where the group meets."""
        calls, met = [], set()
        for new in fresh:
            for edge, (method, end) in self.sync_setup.get(new.id, {}).items():
                if not TRANSPORTS[self.transports[edge]].meets:
                    calls.append((getattr(new.actor, method).remote(str(edge), end), new, f"sync {edge}: start"))
                elif edge not in met:
                    met.add(edge)
                    calls += self._connect_edge(edge)
        wait_all(calls, Deadline(self.timeouts.start_s, f"the replacement of {names}: its sync routes"))
