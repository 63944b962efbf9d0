"""What a run writes down as it happens, beside its outputs: each failure (`failures.jsonl`, and printed where a
replica was replaced in place) and where each replica runs (`processes.json`, for tools that watch a run)."""

from __future__ import annotations

import json
import os

from m2flow.runtime.launch import Launch
from m2flow.runtime.nodes import addresses
from m2flow.runtime.replace import Replacement
from m2flow.runtime.reporting import Reporter
from m2flow.runtime.run_record import RunResult, failure_entry


class RunLog:
    """What a run writes down as it happens, beside its result: failures, a replacement's lines, its processes."""

    def __init__(self, result: RunResult, reporter: Reporter):
        self.result, self.reporter = result, reporter

    def failure(self, failure: dict) -> None:
        """A failure, in the result and appended to the run folder's failures.jsonl as it happens."""
        self.result.failures.append(failure)
        with open(self.result.run_dir / "failures.jsonl", "a", encoding="utf-8") as log:
            log.write(json.dumps(failure) + "\n")

    def replaced(self, r: Replacement, launch: Launch) -> None:
        """A replica replaced in place: recorded, printed and noted as it happens."""
        failure = failure_entry(
            r.iteration,
            r.why,
            r.detected_at,
            replaced=str(r.replica),
            steps_redone=r.steps_redone,
            env=r.env,
            quarantined=r.quarantined,
            state=r.state,
            spare=r.spare,
            moved=r.moved,
            seconds=r.seconds,
        )
        self.failure(failure)
        named = "" if r.env is None else f" (env {r.env})"
        self.reporter.print(f"m2flow: {r.replica} failed in iteration {r.iteration}{named}: {r.why}")
        redone = f"its {r.steps_redone} env steps redone, the other replicas kept theirs" if r.steps_redone else ""
        where = f", on {r.moved.borrowed}: the node at {r.moved.address} no longer answers" if r.moved else ""
        self.reporter.print(
            f"m2flow: {r.replica} replaced in place ({r.state}{', in a spare process' if r.spare else ''}{where});"
            f" {redone or 'no env step redone'},"
            f" {r.seconds:.1f}s after the failure was seen"
        )
        self.processes(launch)

    def processes(self, launch: Launch) -> None:
        """Where each replica runs now (a replacement runs in a new process), also in the run folder's
        processes.json for tools that watch a run (a profiler, a fault injector)."""
        self.result.nodes = {str(replica): node for replica, node in launch.processes.nodes.items()}
        self.result.pids = {str(replica): pid for replica, pid in launch.processes.pids.items()}
        ips = addresses()
        where = {
            replica: {"node": node, "address": ips.get(node), "pid": self.result.pids[replica]}
            for replica, node in self.result.nodes.items()
        }
        tmp = self.result.run_dir / ".processes.json.tmp"
        tmp.write_text(json.dumps(where, indent=1))
        os.replace(tmp, self.result.run_dir / "processes.json")
