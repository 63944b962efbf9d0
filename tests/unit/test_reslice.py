"""A simulator's saved state follows a switch to another number of pipeline stages: the state of a replica's
slices, cut otherwise, loads into the new slices, and they step exactly as the envs would have."""

from __future__ import annotations

import numpy as np
import pytest

from m2flow.context import WorkerContext, set_context
from m2flow.errors import WorkerError
from m2flow.runtime.host import WorkerHost
from m2flow.workers.env import GymEnv


def pendulums(first: int, last: int, tmp_path) -> GymEnv:
    """A slice of a replica's envs `first..last` (normalised observations: their statistics travel too)."""
    set_context(WorkerContext(worker="env", kind="simulator", replica=0, items=(first, last), output_dir=str(tmp_path)))
    return GymEnv(env_id="InvertedPendulum-v5", num_envs=last - first)


def actions(envs: int, k: int) -> np.ndarray:
    return np.linspace(-0.4, 0.4, envs, dtype=np.float32)[:, None] * (1 + k % 3)


def test_one_slice_s_state_cut_into_two_steps_as_the_whole_would_and_cut_back_is_the_same(tmp_path):
    whole = pendulums(0, 4, tmp_path)
    whole.obs()
    for k in range(7):
        whole.step(actions(4, k))
    state = whole.state_dict()
    halves = GymEnv.reslice_states([state], 2)
    first, second = pendulums(0, 2, tmp_path), pendulums(2, 4, tmp_path)
    first.load_state_dict(halves[0])
    second.load_state_dict(halves[1])
    for k in range(7, 30):  # past episode ends: the pendulums fall and reset from their restored RNGs
        expected = whole.step(actions(4, k))["obs"]
        got = np.concatenate([first.step(actions(4, k)[:2])["obs"], second.step(actions(4, k)[2:])["obs"]])
        np.testing.assert_array_equal(got, expected)
    (back,) = GymEnv.reslice_states(GymEnv.reslice_states([state], 2), 1)
    assert back["envs"] == state["envs"]
    for key in ("arrays", "episodes"):
        assert state[key].keys() == back[key].keys()
        for name, value in state[key].items():
            np.testing.assert_array_equal(back[key][name], value)
    assert GymEnv.reslice_states([{}, {}], 1) == [{}]  # saved before the first observation: nothing to cut


class Stateful:
    def state_dict(self) -> dict:
        return {"n": 1}

    def load_state_dict(self, state: dict) -> None:
        self.state = state


def test_a_state_saved_of_other_slices_of_a_class_that_cannot_cut_it_is_refused_naming_the_stages(tmp_path):
    host = WorkerHost.__new__(WorkerHost)  # the host's hook alone, without Ray
    host.ctx = WorkerContext(worker="env", kind="simulator", replica=1, items=(0, 4), output_dir=str(tmp_path))
    host.instances = [Stateful()]
    with pytest.raises(WorkerError) as err:
        host.hook_each("load_state_dict", [{"n": 1}, {"n": 2}])
    assert "holds the state of 2 slice(s) of each replica and this plan runs 1" in str(err.value)
    assert "placement.pipeline_stages=2" in str(err.value)
    host.hook_each("load_state_dict", [{"n": 3}])
    assert host.instances[0].state == {"n": 3}


def test_a_host_cuts_the_states_of_other_slices_for_its_instances_to_load_and_keep_statistics_from(tmp_path):
    halves = []
    for first, last in ((0, 2), (2, 4)):  # a replica run at two stages: a state per slice
        env = pendulums(first, last, tmp_path)
        env.obs()
        for k in range(5):
            env.step(actions(2, k))
        halves.append(env.state_dict())
    host = WorkerHost.__new__(WorkerHost)
    host.ctx = WorkerContext(worker="env", kind="simulator", replica=0, items=(0, 4), output_dir=str(tmp_path))
    host.instances = [pendulums(0, 4, tmp_path)]  # now at one stage
    host.hook_each("load_state_dict", halves)
    assert [int(s["elapsed"]) for s in halves[0]["envs"] + halves[1]["envs"]] == [
        int(s["elapsed"]) for s in host.instances[0].state_dict()["envs"]
    ]
    assert host.hook_each("load_statistics", halves, True) == [True]  # a replacement keeps their statistics
