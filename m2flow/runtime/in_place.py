"""Recovery in place (`run.on_failure: replace`) as the controller runs it: failed loop replicas replaced
and the unfinished simulators' part of the loop redone (also a simulator that fails as it hands over its
streamed trajectory), loop replicas replaced between loops or in the weight sync (the sync done again),
and a training worker restarted on the same batch. `Controller` mixes it in: these steps issue calls and
record what they did as the rest of the controller does (`call`, `copy_state`, `_call_replica`,
`_record`, `_record_loop`, `_stream`), and `replace.py` decides what may be replaced.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from m2flow.program import own_items
from m2flow.runtime.batches import Call
from m2flow.runtime.loop import Dropped, LoopProgram
from m2flow.runtime.rank_naming import naming_ranks, rank_states, ranks_of
from m2flow.runtime.replace import Failed, droppable
from m2flow.runtime.replica import Replica
from m2flow.runtime.replica_waits import await_calls, await_loop, await_transfer
from m2flow.runtime.stacks import explain
from m2flow.runtime.tracing import TaskEvent
from m2flow.runtime.waits import finished, settle, wait_all
from m2flow.runtime.weight_sync import SyncTransport
from m2flow.schedule import Phase, ReplicaId
from m2flow.spec import Edge, PortRef


@dataclass(frozen=True)
class Issued:
    """A port call as issued, to issue again on a replica restarted in place: its inputs and its output."""

    port: str
    counts: list[int]
    refs: list[Any]
    items: float
    out: Any


class InPlace:
    """The controller's recovery in place (module doc)."""

    def _replace(self, failed: Failed, program: LoopProgram, loop: Phase) -> int:
        """New processes for the failed loop replicas, each restored or reset (an inference replica also
        given the weights its sync edges' sources hold now), and the failed simulators' part of this
        iteration's loop redone, the other replicas' kept; a replacement that fails in the redo is replaced
        in turn, also where it fails handing over its streamed outputs (issued again behind the redo). Returns
        the bytes the redos sent. Past the run's budget of replacements the failure is the iteration's, as
        without replacement."""
        simulator, sent = self.graph.loop.entry.worker, 0
        while failed:
            started = self.replacer.start(failed, "in the loop")
            self._resync([self.launch.replicas[r.worker][r.index] for r, _ in failed], loop)
            shards = {r.index for r, _ in failed if r.worker == simulator}  # a simulator replica holds its own shard
            groups = self._loop_processes(shards) if shards else []
            # a replacement may fail again even with no budget left: caught, it stops the run naming the budget
            in_redo = {r.id for group in groups for r in group}
            may_fail = droppable(self.launch, self.replacer.candidates, budget=len(failed)) & in_redo
            redo = dataclasses.replace(program, droppable=may_fail, only_shards=tuple(sorted(shards)))
            calls = [(group[0].process.run_loop.remote(redo), group[0], "the loop (redo)") for group in groups]
            self._restream([replica for replica, _ in failed])
            deadline = self._loop_deadline("the redone part of the loop", may_fail)
            per_process, again = await_loop(calls, groups, deadline, simulator, may_fail, self.deadlines.channel_s)
            finished = {i for i, stats in enumerate(per_process) if stats is not None}
            for i, dropped in self._await_handover(groups, finished, may_fail).items():
                per_process[i], again[i] = None, dropped
            steps_before = self._result.env_steps
            for group, by_worker in zip(groups, per_process, strict=True):
                for r in group if by_worker is not None else []:
                    sent += self._record_loop(r, by_worker[r.worker], redo)
            failed_again = {r.id: again[i] for i in again for r in groups[i]}
            done = [r for r, _ in failed if r.worker == simulator and r.id not in failed_again]
            share = (self._result.env_steps - steps_before) // max(1, len(done))
            for replica, _ in failed:
                steps = share if replica in done else 0
                replacement = self.replacer.done(replica, started[replica.id], self._it, steps)
                self._result.replacements.append(replacement)
            failed = [(r, again[i]) for i in again for r in groups[i]]
        return sent

    def _await_handover(
        self, processes: list[list[Replica]], finished: set[int], droppable: frozenset[ReplicaId]
    ) -> dict[int, Dropped]:
        """The streamed outputs (a trajectory, say) that `finished` loop processes of `droppable` replicas
        hand over, queued behind their loops: one that dies, raises or hangs in its handover fails as in the
        loop (its part is redone). The others' handovers are the after-loop phase's to wait for."""
        hosting = {r.id: i for i, group in enumerate(processes) for r in group}
        handover = [
            c
            for c in self._stream_calls
            if c[0] not in self._consumes and c[1].id in droppable and hosting.get(c[1].id) in finished
        ]
        if not handover:
            return {}
        _, failed = await_calls(handover, self._deadline("the loop's outputs", "loop"), droppable)
        lost: dict[int, Dropped] = {}
        for j, dropped in failed.items():
            lost.setdefault(hosting[handover[j][1].id], dropped)
        return lost

    def replace_lost_in_checkpoint(self, failed: Failed) -> None:
        """Loop replicas lost as a checkpoint gathered their state, after the iteration: replaced, nothing
        redone (`snapshots.Replacing`); the replacements count with the iteration's, and neither their weight
        sync nor the next iteration, which warms up their processes, counts in the measured costs."""
        kept = self.measured.copy()
        self._replace_outside_loop(failed, "as a checkpoint gathered its state")
        self.measured, self.fresh = kept, True

    def _replace_outside_loop(self, failed: Failed, where: str = "between loops", now: Phase | None = None) -> None:
        """New processes for loop replicas that died or hung outside their loop (while training ran, or in a
        weight sync, the phase running `now`): their trajectories were delivered, so nothing is redone;
        their episode statistics are lost."""
        started = self.replacer.start(failed, where)
        self._resync([self.launch.replicas[r.worker][r.index] for r, _ in failed], now)
        for replica, _ in failed:
            self._result.replacements.append(self.replacer.done(replica, started[replica.id], self._it, 0))

    def _await_sync(self, phase: Phase, calls: list[Call]) -> tuple[list[TaskEvent], list[Call]]:
        """The sync phase's events, and the calls they are of (those that completed). The source publishes
        first (a call on each of its replicas): its failure is the iteration's, as every copy waits on what
        it publishes. Destination loop replicas that then fail (or whose transfer another's loss broke) are
        replaced in place and given what the source holds now, with the rest of their group where the group
        meets again (`replace.await_transfer`). The source's calls that the loss broke must end before the
        group can meet again (`Launch.replace` queues the new meeting behind them): a gloo broadcast fails
        at once when its lost members are killed. The resync publishes anew. Not for a broadcast over NCCL:
        killing its lost members does not end the source's side, which holds the process until the group's
        timeout."""
        edge, transport = self._sync_edge(phase)
        deadline = self._deadline(f"the {phase.op} phase", phase.op, self.deadlines.sync(str(edge)))
        first_copy = len(self.launch.replicas[edge.src.worker])  # `call` publishes on every source replica
        source = self.launch.replicas[edge.src.worker][0]
        in_place = not (transport.meets and source.device.kind == "gpu")
        with naming_ranks(self.launch):
            published = wait_all(calls[:first_copy], deadline)
        transfer = calls[first_copy:]
        replaceable = self.replacer.replaceable() if in_place else frozenset()
        where_out = self._sync_group(edge, transport, transfer)  # a hang names the sync's group, not the source's
        moved, failed = await_transfer(transfer, deadline, edge.dst, replaceable, where_out)
        events = [*published, *moved]
        if failed:
            self._replace_outside_loop(
                [(transfer[i][1], dropped) for i, dropped in failed.items()], "in the weight sync", phase
            )
            self._given_up += settle([ref for (ref, _, _), event in zip(calls, events, strict=True) if event is None])
        done = [(event, call) for event, call in zip(events, calls, strict=True) if event is not None]
        return [event for event, _ in done], [call for _, call in done]

    def _sync_group(
        self, edge: Edge, transport: type[SyncTransport], transfer: list[Call]
    ) -> Callable[[list[int]], str]:
        """Where the members of a sync edge's group (the replicas of its `transfer` calls: the source's send
        and each destination's receive) whose calls are still out are, the others finished; "" for a
        transport without a group."""
        if not transport.meets:
            return lambda out: ""

        def where_out(out: list[int]) -> str:
            finished = tuple(str(call[1].id) for i, call in enumerate(transfer) if i not in out)
            return f"[{ranks_of(self.launch, f'sync {edge}', [transfer[i][1] for i in out], finished)}]"

        return where_out

    def _resync(self, replicas: list[Replica], now: Phase | None) -> None:
        """New processes that receive a sync edge (those its port's dispatch sends a state to) get what its source
        holds now (a new process starts from its initial state: an inference replica from its initial weights):
        they alone, or every destination replica that receives it where the transport hands each publish to all
        (a broadcast reaches the whole group that met again; CUDA IPC shares the state once per destination, each
        share taken). The sync phase's context switches come first, the phase running `now` gets its own back
        after."""
        for phase in (p for p in self.plan.phases if p.op == "sync"):
            edge, transport = self._sync_edge(phase)
            receivers = self.graph.info[edge.dst.worker].state_receivers(edge.dst.port)
            targets = [r for r in replicas if r.worker == edge.dst.worker and r.index in receivers]
            if not targets:
                continue
            if phase != now:
                self.swap(phase)
            self.copy_state(
                edge.dst, self.call(edge.src, [], phase)[0], phase, None if transport.all_receive else targets
            )
            calls, self._calls = self._calls, []
            deadline = self._deadline(f"sync {edge} to a replacement", "sync", self.deadlines.sync(str(edge)))
            self._record(wait_all(calls, deadline), calls)
            if now is not None and phase != now:
                self.swap(now)

    def _restream(self, replaced: list[Replica]) -> None:
        """Streamed outputs of replaced replicas: the calls that died with them (and the part calls given
        their outputs) are dropped; their replacements' outputs are streamed instead."""
        if not self._streamed:  # nothing streams in this plan
            return
        then = self._then_phase()
        gone = {id(r) for r in replaced}
        dead = {ref for ref, r in self._producer.items() if id(r) in gone}
        calls, self._stream_calls = self._stream_calls, []
        for call in calls:
            if id(call[1]) in gone or self._consumes.get(call[0]) in dead:
                self._given_up.append(call[0])  # failed with the replaced replica
            else:
                self._stream_calls.append(call)
        for src, refs in self._streamed.items():
            for i, ref in enumerate(refs):
                if ref in dead:
                    new = self.launch.replicas[src.worker][self._producer[ref].index]
                    items = own_items(self.graph, src.worker, new.index, then.op)
                    refs[i] = self._call_replica(new, src.port, [], [], items, then)
        self._stream(then, only={r.id for r in replaced})

    def _await_then(
        self, phase: Phase, calls: list[Call], produced: dict[PortRef, list[Any]]
    ) -> tuple[list[TaskEvent], list[Call]]:
        """The after-loop phase's events, and its calls as last issued: a training worker whose rank fails
        (dies, raises, or hangs past the phase's deadline: its other ranks are given up with it) is restarted
        in place from the checkpoint right before this iteration and given its calls again, on the same
        batch, when the replacer may; any other failure is the iteration's."""
        deadline = self._deadline("the then phase", "then")
        workers = sorted({r.worker for _, r, _ in calls})
        checkpoints = {w: c for w in workers if (c := self.replacer.group_checkpoint(w, self._it)) is not None}
        restartable = frozenset(r.id for _, r, _ in calls if r.worker in checkpoints)
        with naming_ranks(self.launch):
            events, failed = await_calls(calls, deadline, restartable, together=True)
        if not failed:
            return events, calls
        for worker in sorted({calls[i][1].worker for i in failed}):
            i, dropped = self._culprit(worker, calls, {i: d for i, d in failed.items() if calls[i][1].worker == worker})
            started = self.replacer.restart_group(worker, checkpoints[worker], dropped)
            calls = self._reissue(calls, worker, produced, phase)
            self._result.replacements.append(self.replacer.done(calls[i][1], started, self._it, 0))
        with naming_ranks(self.launch):
            return wait_all(calls, self._deadline("the then phase (redone)", "then")), calls

    def _culprit(self, worker: str, calls: list[Call], failed: dict[int, Dropped]) -> tuple[int, Dropped]:
        """Which of `worker`'s failed calls failed first of its own: a rank whose process died (on this
        host); else, where the ranks are still out, one that did not arrive at the collective the others
        wait in (the explanation added); else the first failure seen."""
        ids = {calls[i][1].id: i for i in failed}
        processes = self.launch.processes
        dead = [i for r, i in ids.items() if processes.on_this_host(r) and not processes.alive_here(r)]
        if dead:
            return dead[0], failed[dead[0]]
        first = min(failed, key=lambda i: failed[i].at)
        if not self.launch.rendezvous.get(worker) or all(finished(calls[i][0]) for i in failed):
            return first, failed[first]
        try:
            states = rank_states(self.launch, self.launch.replicas[worker])
        except OSError:  # the question is a courtesy: the first failure seen stands
            return first, failed[first]
        absent = {s.rank for s in states if not s.arrived}
        out = [i for r, i in ids.items() if str(r) in absent]
        i = out[0] if out else first
        return i, dataclasses.replace(failed[i], why=f"{failed[i].why} [{explain(worker, states)}]")

    def _reissue(self, calls: list[Call], worker: str, produced: dict[PortRef, list[Any]], phase: Phase) -> list[Call]:
        """`calls` with those of `worker`'s replicas issued again, in the same order, on its new processes;
        their outputs renamed in `produced`."""
        renamed, again = {}, []
        for ref, r, what in calls:
            if r.worker != worker:
                again.append((ref, r, what))
                continue
            issued = self._issued[ref]
            new = self.launch.replicas[worker][r.index]
            renamed[issued.out] = self._call_replica(new, issued.port, issued.counts, issued.refs, issued.items, phase)
            again.append(self._calls.pop())
        for port, refs in produced.items():
            produced[port] = [renamed.get(ref, ref) for ref in refs]
        return again
