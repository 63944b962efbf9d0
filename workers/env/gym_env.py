"""A gymnasium simulator worker: vectorised envs, auto-reset, episode statistics, trajectory buffer.

Ports: `obs()` the current observations, `step(policy_out)` one step of every env (records what the
policy sent with the actions: log-probs and values), `trajectory()` the steps since the last call.
Observations go out as `{"obs": array, "env_id": global env indices}`. Each env is seeded by its global
index, so results do not depend on how envs are split over replicas or pipeline slices; a failing env
names itself (`m2flow.EnvFailed`), and one the runtime quarantined starts from a new seed.

With `normalize_obs` (default) each env's observations are normalised with running statistics, as CleanRL
does (`obs_statistics.py`: per env, or one per replica with `share_obs_statistics`); the statistics are part
of the worker's checkpointed state, and evaluation freezes them.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
from pydantic import AfterValidator, Field

import m2flow
from m2flow.workers.env.env_ids import registered
from m2flow.workers.env.evaluation import EVALUATE_DISPATCH, Evaluated, Evaluator
from m2flow.workers.env.obs_statistics import (
    ObsNormalization,
    freeze_at,
    frozen,
    load_statistics_arrays,
    normalized,
    replica_envs,
    share_statistics,
    statistics_arrays,
)
from m2flow.workers.env.recording import Recorder
from m2flow.workers.env.video import EpisodeVideo

if TYPE_CHECKING:
    import gymnasium as gym


class GymEnvConfig(Evaluated, m2flow.WorkerConfig, ObsNormalization):
    items_field = "num_envs"
    agreeing_fields = {"loop": frozenset({"env_id"})}  # the policy acting on it reads its sizes from the same env

    env_id: Annotated[str, AfterValidator(registered)] = Field(description="a registered gymnasium env id")
    num_envs: int = Field(1, ge=1, description="envs per replica, cut across pipeline slices")
    clip_actions: bool = Field(True, description="clip actions to the action space's bounds before stepping")
    env_kwargs: dict[str, Any] = Field(default_factory=dict, description="passed to gymnasium.make")


class GymEnv:
    Config = GymEnvConfig
    port_dispatch = EVALUATE_DISPATCH

    def __init__(self, **args: Any):
        import gymnasium as gym

        self.config = GymEnvConfig(**args)
        ctx = m2flow.context()
        first, last = ctx.items
        self.env_ids = np.arange(first, last)
        self.envs = gym.vector.SyncVectorEnv(
            [partial(make_named, self.config, int(i)) for i in self.env_ids],
            autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        )
        self.replica_envs = replica_envs(ctx, self.envs.envs)  # this replica's, over its pipeline slices
        if self.config.share_obs_statistics:
            share_statistics(self.replica_envs)
        self.seeds = [ctx.env_seed(int(i)) for i in self.env_ids]
        self._obs: np.ndarray | None = None
        self._done = np.zeros(len(self.env_ids), dtype=np.float32)
        self.recorder = Recorder(len(self.env_ids))
        self.low, self.high = self.envs.single_action_space.low, self.envs.single_action_space.high
        self.evaluator = None  # one per worker: on the first replica's first slice
        if self.config.evaluation is not None and ctx.replica == 0 and ctx.stage == 0:
            self.evaluator = self._evaluator(Path(ctx.output_dir) / "videos" / ctx.worker, ctx.seed)
        self._evaluated: dict[str, float] = {}

    def obs(self) -> dict[str, np.ndarray]:
        if self._obs is None:
            self._obs, _ = self.envs.reset(seed=self.seeds)
            self._obs = self._obs.astype(np.float32)
        return {"obs": self._obs, "env_id": self.env_ids}

    def step(self, policy_out: dict[str, np.ndarray] | np.ndarray) -> dict[str, np.ndarray]:
        out = policy_out if isinstance(policy_out, dict) else {"action": policy_out}
        action = np.asarray(out["action"])
        env_action = np.clip(action, self.low, self.high) if self.config.clip_actions else action
        next_obs, reward, terminated, truncated, info = self.envs.step(env_action)
        self.recorder.record(self._obs, self._done, reward, {**out, **self._cut_short(terminated, truncated, info)})
        done = np.logical_or(terminated, truncated)
        self.recorder.count(reward)
        self.recorder.end_episodes(done)
        self._obs = next_obs.astype(np.float32)
        self._done = done.astype(np.float32)
        return self.obs()

    def _cut_short(self, terminated: np.ndarray, truncated: np.ndarray, info: dict) -> dict[str, np.ndarray]:
        """Episodes a time limit ended (not the task): their final observation, so training can bootstrap its
        value as SB3 does, instead of treating the cut as the end of the return."""
        cut = np.logical_and(truncated, np.logical_not(terminated))
        final = np.zeros_like(self._obs)
        for i in np.flatnonzero(cut):
            final[i] = info["final_obs"][i]
        return {"truncated": cut.astype(np.float32), "final_obs": final}

    def trajectory(self) -> dict[str, np.ndarray]:
        """Everything since the last call, time-major [T, envs, ...], plus the state to bootstrap from."""
        return self.recorder.trajectory(self.obs()["obs"].copy(), self._done, self.env_ids)

    def evaluate(self, weights: dict[str, Any]) -> None:
        """Deterministic episodes with these weights (`evaluation` in the args), observations normalised with
        this replica's statistics of the moment (frozen); results in the next metrics."""
        if self.evaluator is None:
            return
        if self.config.normalize_obs:
            freeze_at(self.evaluator.env, self.replica_envs)
        self._evaluated = self.evaluator.run(weights)

    def metrics(self) -> dict[str, float]:
        evaluated, self._evaluated = self._evaluated, {}
        return {**self.recorder.metrics(), **evaluated}

    def _evaluator(self, folder: Path, seed: int) -> Evaluator:
        import mujoco

        env = frozen(make_normalized(self.config))
        video = None
        if self.config.video.save:
            model = env.unwrapped.model
            camera = self.config.video.camera or mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_CAMERA, 0)
            video = EpisodeVideo(self.config.video, model, camera, folder)
        observe = lambda observation: {"obs": np.asarray(observation, np.float32)[None]}  # noqa: E731
        return Evaluator(self.config.evaluation, env, observe, seed, self.config.clip_actions, video)

    def state_dict(self) -> dict[str, Any]:
        """Everything the next step depends on, for exact resume: physics state, RNGs, step counters,
        the pending observations, the observation statistics and episode statistics. Non-MuJoCo envs
        restart their episodes instead."""
        from m2flow.workers.env.mujoco_state import is_mujoco, simulator_state

        if self._obs is None or not all(is_mujoco(env) for env in self.envs.envs):
            return {}
        statistics = statistics_arrays(self.envs.envs)
        return simulator_state(self.envs.envs, self.recorder, obs=self._obs, done=self._done, **statistics)

    @staticmethod
    def reslice_states(states: list[dict[str, Any]], parts: int) -> list[dict[str, Any]]:
        """Its slices' saved states cut into `parts` slices (after a switch to another number of stages)."""
        from m2flow.workers.env.mujoco_state import resliced_states

        return resliced_states(states, parts)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from m2flow.workers.env.mujoco_state import load_simulator_state

        if not state:
            return
        self.obs()  # the first reset builds the envs' internal state, then it is overwritten
        arrays = load_simulator_state(self.envs.envs, self.recorder, state)
        self._obs, self._done = arrays["obs"], arrays["done"]
        self.load_statistics(state)

    def load_statistics(self, state: dict[str, Any]) -> bool:
        """What a replacement whose envs start anew keeps of a checkpointed state: each env's observation
        statistics, which the policy learned on (fresh ones would feed it observations on another scale);
        whether the state held any."""
        return load_statistics_arrays(self.envs.envs, state.get("arrays", {}))


def make_named(config: GymEnvConfig, index: int) -> gym.Env:
    """Env `index` of the run, made as the config asks; a failure of it names it."""
    from m2flow.workers.env.failures import NamedFailures

    return NamedFailures(make_normalized(config), index)


def make_normalized(config: GymEnvConfig) -> gym.Env:
    """One env as the config asks: observations normalised per env and clipped, as CleanRL does."""
    import gymnasium as gym

    return normalized(gym.make(config.env_id, **config.env_kwargs), config)
