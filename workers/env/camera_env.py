"""A camera simulator worker for MuJoCo tasks (gymnasium MuJoCo, Meta-World): action chunks, and
observations built only where the policy reads them.

`step(policy_out)` runs a chunk of C actions per env: physics, reward, termination every step; an env
whose episode ends inside the chunk idles until the chunk ends and then starts its next episode. The
observation — only the cameras and modalities in `observation`, at its size — is rendered once, at
the chunk's end. `obs_every_step: true` renders after every physics step instead (what a simulator that
knows nothing of chunks does); results are identical, only slower. `evaluate(weights)` (a sync edge)
plays deterministic evaluation episodes on an env of its own, filmed when `video.save` is on
(`evaluation.py`).

With `normalize_obs` (default) the proprioception, where the policy reads it, is normalised per env with running
statistics, as a `GymEnv`'s observations are (`obs_statistics.py`); the images are left to the policy.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
from pydantic import AfterValidator, Field, model_validator

import m2flow
from m2flow.errors import SpecError
from m2flow.workers.env.env_ids import make_env, registered
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
from m2flow.workers.env.observation import CameraObservation
from m2flow.workers.env.recording import Recorder
from m2flow.workers.env.spaces import camera_refusal
from m2flow.workers.env.video import EpisodeVideo

if TYPE_CHECKING:
    import gymnasium as gym


class CameraEnvConfig(Evaluated, m2flow.WorkerConfig, ObsNormalization):
    items_field = "num_envs"
    # the policy acting on it reads its sizes from the same env, emits chunks as long, reads these cameras
    agreeing_fields = {"loop": frozenset({"env_id", "chunk", "observation"})}

    env_id: Annotated[str, AfterValidator(registered)] = Field(
        description="a registered gymnasium MuJoCo or Meta-World env id"
    )
    num_envs: int = Field(1, ge=1, description="envs per replica, cut across pipeline slices")
    observation: CameraObservation = Field(description="the cameras, modalities and size the policy reads")
    render_profile: Literal["fast", "full"] = Field(
        "fast", description="fast: no anti-aliasing, shadows or reflections (MACHINE.md); full: the model's own"
    )
    chunk: int = Field(1, ge=1, description="actions per policy call (an action chunk)")
    obs_every_step: bool = Field(False, description="render after every physics step, not once per chunk (slower)")
    group_size: int = Field(1, ge=1, description="envs per group sharing initial states (GRPO)")
    clip_actions: bool = Field(True, description="clip actions to the action space's bounds before stepping")
    bootstrap_time_limits: bool = Field(
        False,
        description="record which episodes a time limit cut and their final observation (rendered before the"
        " reset), so training bootstraps from it (a replay buffer needs it); the trajectory then carries a"
        " second observation field",
    )
    env_kwargs: dict[str, Any] = Field(default_factory=dict, description="passed to the env's constructor")

    @model_validator(mode="after")
    def _cameras_of_the_model(self) -> CameraEnvConfig:
        if why := camera_refusal(self.env_id, self.env_kwargs, "observation.cameras", self.observation.cameras):
            raise ValueError(why)
        return self


class CameraEnv:
    Config = CameraEnvConfig
    rendering_ports = frozenset({"obs", "step", "evaluate"})  # on the node's GPU where it has one (EGL)
    port_dispatch = EVALUATE_DISPATCH

    def __init__(self, **args: Any):
        from m2flow.workers.env.failures import NamedFailures
        from m2flow.workers.env.rendering import CameraRenderer

        self.config = cfg = CameraEnvConfig(**args)
        ctx = m2flow.context()
        self.worker = ctx.worker
        self.env_ids = np.arange(*ctx.items)
        self.envs = [NamedFailures(self._make_env(), int(i)) for i in self.env_ids]
        self.replica_envs = replica_envs(ctx, self.envs)  # this replica's, over its pipeline slices
        if cfg.share_obs_statistics:
            share_statistics(self.replica_envs)
        view = cfg.observation
        models = [env.unwrapped.model for env in self.envs]
        self.renderer = CameraRenderer(models, view.cameras, view.modalities, view.size, cfg.render_profile)
        size = cfg.group_size
        self.seeds = [ctx.env_seed(int(i), int(i) // size, group(int(i), size)) for i in self.env_ids]
        space = self.envs[0].action_space
        self.low, self.high, self.act_dim = space.low, space.high, int(np.prod(space.shape))
        self.proprio = np.zeros((len(self.envs), int(np.prod(self.envs[0].observation_space.shape))), np.float32)
        self._observation: dict[str, np.ndarray] | None = None
        self.evaluator = None  # one per worker: on the first replica's first slice
        if cfg.evaluation is not None and ctx.replica == 0 and ctx.stage == 0:
            self.evaluator = self._evaluator(Path(ctx.output_dir) / "videos" / ctx.worker, ctx.seed)
        self._evaluated: dict[str, float] = {}
        self._done = np.zeros(len(self.envs), dtype=bool)
        self._succeeded = np.full(len(self.envs), np.nan)  # any success in the episode so far (NaN: no signal)
        self.recorder = Recorder(len(self.envs))
        self.seconds = {"physics": 0.0, "render": 0.0}  # spent since the last metrics(): where a step's time goes

    @property
    def normalizes(self) -> bool:
        """Whether the proprioception is normalised: asked for, and read by the policy."""
        return self.config.normalize_obs and "proprio" in self.config.observation.modalities

    def _make_env(self) -> gym.Env:
        """One env of the task, its proprioception normalised as the config asks."""
        cfg = self.config
        env = make_env(cfg.env_id, **cfg.env_kwargs)
        return normalized(env, cfg) if self.normalizes else env

    def _evaluator(self, folder: Path, seed: int) -> Evaluator:
        """Evaluation on an env of its own, observed as the policy is in training (and filmed, if asked)."""
        from m2flow.workers.env.rendering import CameraRenderer

        cfg, view = self.config, self.config.observation
        env = frozen(self._make_env())
        camera = cfg.video.camera or view.cameras[0]  # filmed from a copy of the model as built (full profile)
        video = EpisodeVideo(cfg.video, env.unwrapped.model, camera, folder) if cfg.video.save else None
        renderer = CameraRenderer([env.unwrapped.model], view.cameras, view.modalities, view.size, cfg.render_profile)

        def observe(proprio: np.ndarray) -> dict[str, np.ndarray]:
            observation = renderer.render([env.unwrapped.data])
            if "proprio" in view.modalities:
                observation["proprio"] = np.asarray(proprio, np.float32)[None]
            return observation

        return Evaluator(cfg.evaluation, env, observe, seed, cfg.clip_actions, video)

    @property
    def render_calls(self) -> dict[str, int]:
        """Camera images rendered so far, per modality."""
        return dict(self.renderer.calls)

    def obs(self) -> dict[str, np.ndarray]:
        if self._observation is None:
            for i, env in enumerate(self.envs):
                self.proprio[i] = env.reset(seed=self.seeds[i])[0]
            self._observation = self._observe()
        return self._observation

    def step(self, policy_out: dict[str, np.ndarray] | np.ndarray) -> dict[str, np.ndarray]:
        out = policy_out if isinstance(policy_out, dict) else {"action": policy_out}
        actions = np.asarray(out["action"]).reshape(len(self.envs), -1, self.act_dim)
        if self.config.clip_actions:
            actions = np.clip(actions, self.low, self.high)
        started_from, began = self.obs(), self._done.copy()
        reward = np.zeros(len(self.envs))
        steps = np.zeros(len(self.envs), dtype=np.int64)
        done = np.zeros(len(self.envs), dtype=bool)
        cut = np.zeros(len(self.envs), dtype=bool)  # a time limit ended the episode, not the task
        began_at, rendered = time.perf_counter(), self.seconds["render"]
        for c in range(actions.shape[1]):
            for i, env in enumerate(self.envs):
                if done[i]:
                    continue
                obs, r, terminated, truncated, info = env.step(actions[i, c])
                self.proprio[i], reward[i], steps[i] = obs, reward[i] + r, steps[i] + 1
                if "success" in info:
                    self._succeeded[i] = max(np.nan_to_num(self._succeeded[i]), float(info["success"]))
                done[i] = terminated or truncated
                cut[i] = truncated and not terminated
            if self.config.obs_every_step:
                self._observe()
        self.seconds["physics"] += time.perf_counter() - began_at - (self.seconds["render"] - rendered)
        self.recorder.record(started_from, began, reward, {**out, **self._cut_short(started_from, cut)})
        self.recorder.count(reward, steps)
        self.recorder.end_episodes(done, self._succeeded)
        for i in np.flatnonzero(done):
            self.proprio[i] = self.envs[i].reset()[0]
            self._succeeded[i] = np.nan
        self._done = done
        self._observation = self._observe()
        return self._observation

    def _cut_short(self, observation: dict[str, np.ndarray], cut: np.ndarray) -> dict[str, Any]:
        """With `bootstrap_time_limits`: which episodes a time limit cut and their final observation (the
        other rows zero), rendered before the envs reset."""
        if not self.config.bootstrap_time_limits:
            return {}
        final = {m: np.zeros_like(v) for m, v in observation.items() if m != "env_id"}
        if cut.any():
            for m, views in self._render(np.flatnonzero(cut)).items():
                final[m][cut] = views
            if "proprio" in final:
                final["proprio"][cut] = self.proprio[cut]
        return {"truncated": cut.astype(np.float32), "final_obs": final}

    def _observe(self) -> dict[str, np.ndarray]:
        observation = self._render(np.arange(len(self.envs)))
        if "proprio" in self.config.observation.modalities:
            observation["proprio"] = self.proprio.copy()
        observation["env_id"] = self.env_ids
        return observation

    def _render(self, envs: np.ndarray) -> dict[str, np.ndarray]:
        """The views of these envs (local indices), each drawn in its own tile; a crash while drawing an
        env's scene counts against that env."""
        datas = [self.envs[i].unwrapped.data for i in envs]
        began_at = time.perf_counter()
        views = self.renderer.render(datas, lambda k: self.envs[envs[k]].working, slots=envs)
        self.seconds["render"] += time.perf_counter() - began_at
        return views

    def trajectory(self) -> dict[str, Any]:
        """Every chunk since the last call, time-major [T, envs, ...]; rewards are summed over the chunk."""
        return self.recorder.trajectory(self.obs(), self._done, self.env_ids)

    def evaluate(self, weights: dict[str, Any]) -> None:
        """Evaluation episodes with these weights (`evaluation` in the args); results in the next metrics."""
        if self.evaluator is None:
            return
        if self.normalizes:
            freeze_at(self.evaluator.env, self.replica_envs)  # this replica's statistics of the moment
        self._evaluated = self.evaluator.run(weights)

    def metrics(self) -> dict[str, float]:
        """Episode statistics, evaluation results, and the seconds spent stepping physics (`env/physics_s`)
        and rendering (`env/render_s`, waiting for the GPU's read-back included) since the last call."""
        evaluated, self._evaluated = self._evaluated, {}
        spent = {f"env/{part}_s": seconds for part, seconds in self.seconds.items()}
        self.seconds = dict.fromkeys(self.seconds, 0.0)
        return {**self.recorder.metrics(), **evaluated, **spent}

    def state_dict(self) -> dict[str, Any]:
        from m2flow.workers.env.mujoco_state import simulator_state

        if self._observation is None:
            return {}
        statistics = statistics_arrays(self.envs)
        return simulator_state(self.envs, self.recorder, proprio=self.proprio, done=self._done, **statistics)

    @staticmethod
    def reslice_states(states: list[dict[str, Any]], parts: int) -> list[dict[str, Any]]:
        """Its slices' saved states cut into `parts` slices (after a switch to another number of stages)."""
        from m2flow.workers.env.mujoco_state import resliced_states

        return resliced_states(states, parts)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from m2flow.workers.env.mujoco_state import load_simulator_state

        if not state:
            return
        self.obs()
        arrays = load_simulator_state(self.envs, self.recorder, state)
        self.proprio, self._done = arrays["proprio"], arrays["done"]
        self.load_statistics(state)
        saved = "obs_mean" in arrays
        if saved != self.normalizes:  # the policy learned on the one scale: read it on the same
            done = "normalised" if saved else "did not normalise"
            raise SpecError(
                [
                    f"workers.{self.worker}.args.normalize_obs: the checkpoint's simulator {done} the"
                    f" proprioception; set normalize_obs: {str(saved).lower()} to resume or evaluate it as it was"
                    " trained (camera runs saved before camera simulators normalised it by default did not)"
                ]
            )
        self._observation = self._observe()

    def load_statistics(self, state: dict[str, Any]) -> bool:
        """What a replacement whose envs start anew keeps of a checkpointed state: each env's proprioception
        statistics, which the policy learned on; whether any were kept (the state held them and the envs
        normalise)."""
        return load_statistics_arrays(self.envs, state.get("arrays", {}))


def group(env: int, size: int) -> range:
    """The envs of `env`'s group: they start from one seed (GRPO compares their returns)."""
    first = env - env % size
    return range(first, first + size)
