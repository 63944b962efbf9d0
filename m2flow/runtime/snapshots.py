"""Checkpoint orchestration: which hooks each worker's replicas are asked for, and where their files go.

A checkpoint holds `state.pt` (each replica's `state_dict()`; a process group's rank 0 speaks for the
group) and a folder per worker that writes its own files (`save_checkpoint(path)`: a group writes into
one folder together, every rank at once; other workers get one folder per replica). `checkpoint.py`
makes the directory atomic. The first checkpoint's hooks, and every restore's, wait as long as workers may
take to start; later checkpoints' hooks x`safety_factor` the last one's time, within [`floor_s`,
`ceiling_s`] (`run.timeouts`), so a host cut off while the state is gathered is caught at that, its group's
ranks named. A loop replica that may be replaced in place (`run.on_failure: replace`) and dies or hangs as
its state is gathered is replaced, and the checkpoint holds its replacement's state (`Replacing`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from m2flow.errors import SpecError
from m2flow.graph import MacroGraph
from m2flow.runtime.checkpoint import load_checkpoint, save_checkpoint
from m2flow.runtime.launch import Launch
from m2flow.runtime.rank_naming import naming_ranks
from m2flow.runtime.replace import Failed
from m2flow.runtime.replica import Replica
from m2flow.runtime.replica_waits import await_calls
from m2flow.runtime.waits import Deadline, wait_all
from m2flow.schedule import ReplicaId


@dataclass(frozen=True)
class Replacing:
    """The loop replicas a checkpoint may replace in place now, and what replaces them (the controller's
    recovery in place: new processes, weights synced, the replacement recorded)."""

    replaceable: Callable[[], frozenset[ReplicaId]]
    replace: Callable[[Failed], None]


class Snapshots:
    def __init__(self, graph: MacroGraph, launch: Launch):
        self.graph, self.launch = graph, launch
        self.timeouts = launch.timeouts  # restoring waits `start_s`: as long as a worker may take to start
        self.saved_in_s: float | None = None  # how long these workers' last checkpoint took
        self._replaced = False  # the checkpoint being written replaced a lost replica

    def save(self, root: Path, iteration: int, meta: dict, replacing: Replacing | None = None) -> Path:
        """A checkpoint of every worker; how long it took sets the next one's deadline, unless it waited on
        a lost replica and its replacement (a second hang would be caught that much later)."""
        began = time.monotonic()
        self._replaced = False
        path = save_checkpoint(root, iteration, self._states(replacing), meta, write_files=self._write_files)
        if not self._replaced:
            self.saved_in_s = time.monotonic() - began
        return path

    @property
    def saving_s(self) -> float:
        """The deadline of a checkpoint's hooks (module doc)."""
        if self.saved_in_s is None:
            return self.timeouts.start_s
        derived = self.saved_in_s * self.timeouts.safety_factor
        return min(self.timeouts.ceiling_s, max(self.timeouts.floor_s, derived))

    def restore(self, checkpoint: Path) -> None:
        state, _ = load_checkpoint(checkpoint)
        self._load_states(state)
        self._read_files(checkpoint)

    def restore_workers(self, checkpoint: Path, workers: list[str]) -> None:
        """These workers' part of a checkpoint (a training worker restarted in place), every replica at once
        (a group reads its files together)."""
        state, _ = load_checkpoint(checkpoint)
        self._load_states({name: state[name] for name in workers if name in state})
        replicas = [r for name in workers if (checkpoint / name).is_dir() for r in self.launch.replicas[name]]
        self._hooks(replicas, "load_checkpoint", f"load_checkpoint() of {', '.join(workers)} restarted", checkpoint)

    def restore_statistics(self, checkpoint: Path, replica: Replica) -> bool:
        """What a simulator replaced with its envs started anew keeps of its part of a checkpoint (its optional
        `load_statistics` hook: observation statistics the policy learned on, say); whether it kept any."""
        value = self._replica_state(checkpoint, replica)
        if value is None:
            return False
        call = (replica.actor.hook_each.remote("load_statistics", value, True), replica, "load_statistics()")
        what = f"load_statistics() of the replacement of {replica.id}"
        (kept,) = wait_all([call], Deadline(self.timeouts.start_s, what))
        return any(kept or [])

    def restore_replica(self, checkpoint: Path, replica: Replica) -> None:
        """One replica's part of a checkpoint (a simulator replaced in place): its state and its files."""
        value = self._replica_state(checkpoint, replica)
        calls = []
        if value is not None:
            calls.append((replica.actor.hook_each.remote("load_state_dict", value), replica, "load_state_dict()"))
        wait_all(calls, Deadline(self.timeouts.start_s, f"load_state_dict() of the replacement of {replica.id}"))
        if self._files(checkpoint, replica).is_dir():
            what = f"load_checkpoint() of the replacement of {replica.id}"
            self._hooks([replica], "load_checkpoint", what, checkpoint)

    def _replica_state(self, checkpoint: Path, replica: Replica) -> Any:
        """`replica`'s entry in the checkpoint's state (a group's is its worker's one), None if it has none."""
        per_replica = load_checkpoint(checkpoint)[0].get(replica.worker)
        if not per_replica:
            return None
        return per_replica[0 if self.graph.info[replica.worker].group else replica.index]

    def _hooks(
        self, replicas: list[Replica], hook: str, what: str, folder: Path | None = None, timeout_s: float | None = None
    ) -> list[Any]:
        """Call `hook` on every replica (given `folder`, with the path of its files there)."""
        calls = [
            (r.actor.hook.remote(hook, *([str(self._files(folder, r))] if folder else [])), r, f"{hook}()")
            for r in replicas
        ]
        with naming_ranks(self.launch):
            return wait_all(calls, Deadline(timeout_s or self.timeouts.start_s, what))

    def _files(self, directory: Path, replica: Replica) -> Path:
        """Where a worker's own files go: one folder for a group, one per replica otherwise."""
        folder = directory / replica.worker
        return folder if self.graph.info[replica.worker].group else folder / str(replica.index)

    def _write_files(self, directory: Path) -> None:
        replicas = [r for group in self.launch.replicas.values() for r in group]
        self._hooks(replicas, "save_checkpoint", "save_checkpoint() hooks", directory, self.saving_s)

    def _read_files(self, checkpoint: Path) -> None:
        saved = {p.name for p in checkpoint.iterdir() if p.is_dir()}
        unknown = saved - set(self.launch.replicas)
        if unknown:
            raise SpecError([f"workers: the checkpoint holds worker '{sorted(unknown)[0]}', this workflow has none"])
        replicas = [r for name in sorted(saved) for r in self.launch.replicas[name]]
        self._hooks(replicas, "load_checkpoint", "load_checkpoint() hooks on resume", checkpoint)

    def _states(self, replacing: Replacing | None) -> dict[str, list]:
        """Per worker, per replica, per instance state (a group keeps rank 0's), every replica asked at once."""
        replicas = [r for group in self.launch.replicas.values() for r in group]
        values = iter(self._gather(replicas, replacing))
        state = {}
        for name, group in self.launch.replicas.items():
            per_replica = [next(values) for _ in group]
            if per_replica[0] is not None:
                state[name] = per_replica[:1] if self.graph.info[name].group else per_replica
        return state

    def _gather(self, replicas: list[Replica], replacing: Replacing | None) -> list[Any]:
        """Each replica's `state_dict()`; a replaceable one lost meanwhile is replaced and its replacement's
        state taken instead."""
        replaceable = replacing.replaceable() if replacing is not None else frozenset()
        if not replaceable:
            return self._hooks(replicas, "state_dict", "state_dict() hooks", timeout_s=self.saving_s)
        calls = [(r.actor.hook.remote("state_dict"), r, "state_dict()") for r in replicas]
        with naming_ranks(self.launch):
            values, failed = await_calls(calls, Deadline(self.saving_s, "state_dict() hooks"), replaceable)
        if failed:
            lost = [(calls[i][1], dropped) for i, dropped in failed.items()]
            replacing.replace(lost)
            self._replaced = True
            fresh = [self.launch.replicas[replica.worker][replica.index] for replica, _ in lost]
            for i, value in zip(failed, self._hooks(fresh, "state_dict", "state_dict() of replacements"), strict=True):
                values[i] = value
        return values

    def _load_states(self, state: dict[str, list]) -> None:
        calls = []
        for name, per_replica in state.items():
            group = self.launch.replicas.get(name)
            if group is None:
                raise SpecError([f"workers: the checkpoint holds worker '{name}', this workflow has none"])
            shared = self.graph.info[name].group
            if not shared and len(per_replica) != len(group):
                raise SpecError(
                    [
                        f"workers.{name}.replicas: the checkpoint has {len(per_replica)} replicas, the"
                        f" workflow {len(group)}; resume with the same replica count"
                    ]
                )
            for r in group:
                value = per_replica[0 if shared else r.index]
                calls.append((r.actor.hook_each.remote("load_state_dict", value), r, "load_state_dict()"))
        wait_all(calls, Deadline(self.timeouts.start_s, "load_state_dict() on resume"))
