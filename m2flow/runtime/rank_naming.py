"""Where the ranks of a process group are when a wait on them passes its deadline: which arrived at the
collective the others wait in and which did not (`m2flow.runtime.stacks` asks each rank's process), asked on
this host and through a node's Ray elsewhere, so that a hang names its group and its missing ranks."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from m2flow.errors import WaitTimeout
from m2flow.runtime.launch import Launch
from m2flow.runtime.replica import Replica
from m2flow.runtime.stacks import RankState, ask, ask_on_node, explain


@contextmanager
def naming_ranks(launch: Launch) -> Iterator[None]:
    """A wait that passes its deadline on ranks of a process group says which ranks arrived at a collective
    and which did not, on its first line."""
    try:
        yield
    except WaitTimeout as exc:
        groups = sorted({r.worker for r in exc.stuck if launch.rendezvous.get(r.worker)})
        if not groups:
            raise
        ranks = " ".join(f"[{ranks_of(launch, group, launch.replicas[group])}]" for group in groups)
        raise exc.detailed(ranks) from None


def ranks_of(launch: Launch, group: str, out: list[Replica], finished: tuple[str, ...] = ()) -> str:
    """Where each rank of `group` still `out` is now (the others `finished` their part)."""
    try:
        return explain(group, rank_states(launch, out), finished)
    except OSError as exc:  # the question is a courtesy: never worse than the timeout itself
        return f"process group of '{group}': its ranks could not be asked ({exc})"


def rank_states(launch: Launch, replicas: list[Replica]) -> list[RankState]:
    """Where each of these ranks is: asked on this host, through its node's Ray on another."""
    import ray

    processes = launch.processes
    local = [r for r in replicas if processes.on_this_host(r.id)]
    here = {str(r.id): processes.of[r.id].pid for r in local if processes.alive_here(r.id)}
    states = ask(here, launch.output_dir, ray.util.get_node_ip_address())
    states += [RankState(str(r.id), None, "its process is gone") for r in local if str(r.id) not in here]
    elsewhere: dict[str, dict[str, tuple[int, float]]] = {}
    for r in replicas:
        if r not in local:
            started = processes.of[r.id]
            elsewhere.setdefault(started.node, {})[str(r.id)] = (started.pid, started.at)
    for node, ranks in elsewhere.items():
        states += ask_on_node(node, ranks, launch.output_dir)
    return states
