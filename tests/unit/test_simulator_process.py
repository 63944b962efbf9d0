"""A MuJoCo simulator worker builds, steps and snapshots its state without importing torch (a replacement
process starts in a fraction of the time), and that numpy state comes back from a weights-only checkpoint
exactly: the restored envs step to the same observations."""

from __future__ import annotations

import json
import subprocess
import sys

SIMULATE = """
import json, sys
import numpy as np
from m2flow.context import WorkerContext, set_context
from m2flow.workers.env import GymEnv

set_context(WorkerContext(worker="env", kind="simulator", replica=0, items=(0, 3), output_dir=sys.argv[1]))
env = GymEnv(env_id="InvertedPendulum-v5", num_envs=3)
env.obs()
for _ in range(5):
    env.step(np.full((3, 1), 0.2, np.float32))
env.trajectory()
state = env.state_dict()
torch_before_checkpoint = "torch" in sys.modules

from m2flow.runtime.checkpoint import load_checkpoint, save_checkpoint

loaded, _ = load_checkpoint(save_checkpoint(sys.argv[1], 0, {"env": [state]}, {}))
restored = GymEnv(env_id="InvertedPendulum-v5", num_envs=3)
restored.load_state_dict(loaded["env"][0])
action = np.full((3, 1), -0.3, np.float32)
same = all(np.array_equal(env.step(action)["obs"], restored.step(action)["obs"]) for _ in range(5))
print(json.dumps({"torch": torch_before_checkpoint, "same": same}))
"""


def test_a_mujoco_simulator_runs_without_torch_and_resumes_exactly_from_a_checkpoint(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", SIMULATE, str(tmp_path)], capture_output=True, text=True, timeout=120, check=True
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1])

    assert seen == {"torch": False, "same": True}
