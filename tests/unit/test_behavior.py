"""The BEHAVIOR/OmniGibson adapter's own logic, against a stand-in for OmniGibson (Isaac Sim cannot run
here): what it asks of the simulator, how slices share it, and how data is mapped."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from m2flow.context import WorkerContext, set_context
from m2flow.errors import MissingDependency
from m2flow.workers.env import behavior
from m2flow.workers.env.behavior import R1PRO_CAMERAS, BehaviorConfig, BehaviorEnv, omnigibson_config


class FakeVectorEnvironment:
    """Like OmniGibson's: one simulator, one physics call advances every env; records what it was asked."""

    def __init__(self, num_envs: int, config: dict):
        self.num_envs, self.config = num_envs, config
        self.sim_time, self.get_obs_calls = 0.0, []
        robot = config["robots"][0]
        self.sensors = robot["include_sensor_names"]
        self.size = (
            robot["sensor_config"]["VisionSensor"]["sensor_kwargs"]["image_height"],
            robot["sensor_config"]["VisionSensor"]["sensor_kwargs"]["image_width"],
        )

    def _obs(self):
        return [
            {
                **{f"{s}::rgb": np.full((*self.size, 4), i, np.uint8) for s in self.sensors},
                "robot_r1::proprio": np.full(5, float(i)),
            }
            for i in range(self.num_envs)
        ]

    def reset(self):
        return self._obs(), {}

    def step(self, actions, get_obs: bool = True, render: bool = True):
        assert len(actions) == self.num_envs
        self.sim_time += 1.0 / self.config["env"]["action_frequency"]
        self.get_obs_calls.append(get_obs)
        self.actions = np.stack(actions)
        zeros = np.zeros(self.num_envs, dtype=bool)
        return (self._obs() if get_obs else None), np.ones(self.num_envs), zeros, zeros, [{}] * self.num_envs


class EagerVectorEnvironment(FakeVectorEnvironment):
    """An older OmniGibson whose step always builds observations."""

    def step(self, actions):
        return super().step(actions)


@pytest.fixture
def omnigibson(monkeypatch):
    module, envs = types.ModuleType("omnigibson"), types.ModuleType("omnigibson.envs")
    envs.VectorEnvironment = FakeVectorEnvironment
    monkeypatch.setitem(sys.modules, "omnigibson", module)
    monkeypatch.setitem(sys.modules, "omnigibson.envs", envs)
    behavior._SHARED.clear()
    yield envs
    behavior._SHARED.clear()
    set_context(WorkerContext())


def make(stage: int, stages: int, **args) -> BehaviorEnv:
    per = 4 // stages
    set_context(WorkerContext(items=(stage * per, (stage + 1) * per), replica_items=(0, 4), stage=stage, stages=stages))
    return BehaviorEnv(num_envs=4, cameras=["head", "left_wrist"], size=(8, 6), **args)


def test_the_simulator_is_asked_only_for_what_the_policy_reads():
    config = omnigibson_config(BehaviorConfig(cameras=["head"], modalities=["rgb"], size=(224, 224)), 4, 1)
    robot = config["robots"][0]
    assert robot["obs_modalities"] == ["rgb"] and robot["include_sensor_names"] == [R1PRO_CAMERAS["head"]]
    assert config["render"] == {"viewer_width": 0, "viewer_height": 0}  # no viewport
    assert behavior.process_environment(BehaviorConfig(threads=2))["OMP_NUM_THREADS"] == "2"


@pytest.mark.parametrize("stages", [1, 2])
def test_simulated_time_per_policy_step_does_not_depend_on_the_slices(omnigibson, stages):
    slices = [make(s, stages) for s in range(stages)]
    assert all(s.vec is slices[0].vec for s in slices) and slices[0].vec.num_envs == 4
    for s in slices:
        s.obs()
    for s in slices:  # one policy step: every slice steps its envs once
        s.step({"action": np.zeros((4 // stages, 23), np.float32)})
    assert slices[0].vec.sim_time == pytest.approx(1 / 30)


def test_a_slice_moves_only_its_envs_and_reads_only_its_observations(omnigibson):
    first, second = make(0, 2), make(1, 2)
    obs = second.obs()
    second.step({"action": np.full((2, 23), 0.5, np.float32)})
    assert second.vec.actions[2:].tolist() == [[0.5] * 23] * 2 and second.vec.actions[:2].sum() == 0
    obs = second.step({"action": np.full((2, 23), 7.0, np.float32)})  # clipped to the action range
    assert second.vec.actions[2:].max() == 1.0
    assert obs["rgb"].shape == (2, 2, 8, 6, 3) and obs["rgb"][:, 0, 0, 0, 0].tolist() == [2, 3]
    assert obs["env_id"].tolist() == [2, 3] and first.env_ids.tolist() == [0, 1]


def test_observations_are_built_only_at_the_chunk_end_when_the_simulator_allows(omnigibson):
    env = make(0, 1, chunk=4)
    env.obs()
    env.step({"action": np.zeros((4, 4 * 23), np.float32)})
    assert env.vec.get_obs_calls == [False, False, False, True]
    assert env.trajectory()["reward"].tolist() == [[4.0] * 4]  # four physics steps of reward 1, summed


def test_an_older_simulator_without_lazy_observations_still_works(omnigibson):
    omnigibson.VectorEnvironment = EagerVectorEnvironment
    env = make(0, 1, chunk=2)
    env.obs()
    assert not env.lazy_obs
    assert env.step({"action": np.zeros((4, 2 * 23), np.float32)})["rgb"].shape == (4, 2, 8, 6, 3)


def test_without_omnigibson_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "omnigibson", None)
    monkeypatch.setitem(sys.modules, "omnigibson.envs", None)
    behavior._SHARED.clear()
    with pytest.raises(MissingDependency, match=r"pip install 'm2flow\[behavior\]'"):
        make(0, 1)
    set_context(WorkerContext())
