"""Envs that keep failing their simulator replica (`run.on_failure: replace`).

A simulator names the env whose reset or step failed by raising `m2flow.EnvFailed`, or, where the env crashed
its process (a segfault), through the env its crash record holds (`crashes.py`). The same env failing
`run.quarantine_after` times is quarantined: its replica's replacement starts every env afresh, that one
from a new seed (`WorkerContext.env_seed`), and the run reports it — a bad initial state, say objects
spawned inside each other, costs a replacement, not the job. An env that fails whatever its seed is
quarantined again each time, until the run's replacements (`run.max_replacements`) run out. A process killed
from outside counts against no env.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Quarantine:
    after: int  # failures of one env that quarantine it
    failures: Counter[int] = field(default_factory=Counter)  # env -> failures since it was last quarantined
    times: dict[int, int] = field(default_factory=dict)  # env -> quarantines so far: how far its seed moved

    def record(self, env: int | None) -> bool:
        """Count a failure of `env` (None: unnamed); True when it quarantines the env."""
        if env is None:
            return False
        self.failures[env] += 1
        if self.failures[env] < self.after:
            return False
        del self.failures[env]
        self.times[env] = self.times.get(env, 0) + 1
        return True
