"""A resume whose checkpoint does not load into the workers: which of the settings the run that wrote it had (its
`workflow.yaml`) this one changed, the likely reason (a model's widths, a simulator's envs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from m2flow.errors import CheckpointError, M2FlowError, SpecError
from m2flow.runtime.host import headline
from m2flow.spec import WorkflowSpec


def resume_failure(
    checkpoint: Path, failure: M2FlowError, record: Path, spec: WorkflowSpec, planned: frozenset[str]
) -> M2FlowError:
    """The error to raise where restoring `checkpoint` failed with `failure`: naming each worker setting that differs
    from the run that wrote it (those in `planned`, keys the planner set, as its choice), or `failure` itself where
    none does."""
    try:
        before = yaml.safe_load(record.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return failure
    changed = [
        f"{line} (the planner's choice: set it to pin it)" if line.partition(":")[0] in planned else line
        for line in changed_settings(before.get("workers", {}), spec.to_dict()["workers"], "workers")
    ]
    if not changed:
        return failure
    said = "; ".join(failure.problems) if isinstance(failure, SpecError) else headline(failure)
    return CheckpointError(
        f"run.resume: {checkpoint} did not load into this run's workers ({said}); this run changed what the run"
        f" that wrote it had ({record}): {'; '.join(changed)}. Resume with that run's settings, or start anew"
        " (run.resume: false, or another name)"
    )


def changed_settings(before: Any, after: Any, key: str) -> list[str]:
    """`key: <before> there, <after> here` for every leaf that differs between two nested mappings."""
    if isinstance(before, dict) and isinstance(after, dict):
        return [
            line
            for name in sorted(before.keys() | after.keys(), key=str)
            for line in changed_settings(before.get(name), after.get(name), f"{key}.{name}")
        ]
    return [] if before == after else [f"{key}: {before!r} there, {after!r} here"]
