"""Evaluation episodes inside a camera simulator's process: the policy's deterministic (mean) action, on
an env of their own — the training envs, their RNGs and episodes are untouched — each episode filmed with
the `full` rendering profile when `video.save` is on.

Driven by a sync edge, so it runs every k iterations with the weights of that moment:

    sync: [{edge: actor.weights -> env.evaluate, every: 10}]
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from m2flow.workers.env.rendering import CameraRenderer
from m2flow.workers.env.video import EpisodeVideo

if TYPE_CHECKING:
    import gymnasium as gym

    from m2flow.workers.env.camera_env import CameraEnvConfig


class EvaluationConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    policy: dict[str, Any] = Field(description="the policy's args, as the inference worker's (PolicyArgs)")
    episodes: int = Field(1, ge=1)
    max_steps: int = Field(200, ge=1, description="physics steps per episode at most")
    seed: int = Field(10_000, description="episode e starts from seed run.seed + seed + e")


class Evaluator:
    def __init__(self, env_config: CameraEnvConfig, env: gym.Env, folder: Path, seed: int):
        """`env_config`: the simulator's config (its `evaluation`, `video`, observation); `env`: an env of
        the evaluation's own."""
        from m2flow.workers.models import PolicyArgs  # models import the env package: import here, not at the top

        self.config, self.env, self.env_config = env_config.evaluation, env, env_config
        self.seed = seed + self.config.seed
        self.model = PolicyArgs(**self.config.policy).build().eval()
        view, video = env_config.observation, env_config.video
        self.renderer = CameraRenderer(
            env.unwrapped.model, view.cameras, view.modalities, view.size, env_config.render_profile
        )
        space = env.action_space
        self.low, self.high, self.act_dim = space.low, space.high, int(np.prod(space.shape))
        self.video = (
            EpisodeVideo(video, env.unwrapped.model, video.camera or view.cameras[0], folder) if video.save else None
        )

    def run(self, weights: dict[str, Any]) -> dict[str, float]:
        from m2flow.workers.models import state_checksum

        if state_checksum(weights["state"]) != weights["checksum"]:
            raise ValueError("evaluate: the weights do not match their checksum (a torn update); not evaluated")
        self.model.load_state_dict(weights["state"])
        results = [self._episode(weights["version"], e) for e in range(self.config.episodes)]
        returns, lengths, successes = (np.array(column, dtype=np.float64) for column in zip(*results, strict=True))
        metrics = {"eval/return": float(returns.mean()), "eval/length": float(lengths.mean())}
        if not np.isnan(successes).all():
            metrics["eval/success"] = float(np.nanmean(successes))
        return metrics

    def _episode(self, version: int, episode: int) -> tuple[float, int, float]:
        proprio = self.env.reset(seed=self.seed + episode)[0]
        total, steps, success, done = 0.0, 0, np.nan, False
        while not done:
            actions = self._act(proprio)
            for action in actions:
                proprio, reward, terminated, truncated, info = self.env.step(action)
                total, steps = total + float(reward), steps + 1
                if self.video is not None:
                    self.video.frame(self.env.unwrapped.data)
                if "success" in info:
                    success = max(np.nan_to_num(success), float(info["success"]))
                done = terminated or truncated or steps >= self.config.max_steps
                if done:
                    break
        if self.video is not None:
            self.video.save(f"eval_v{version:05d}_episode{episode}", total, success)
        return total, steps, success

    @torch.no_grad()
    def _act(self, proprio: np.ndarray) -> np.ndarray:
        """The chunk of mean actions for the current observation (rendered as the policy sees it in training)."""
        observation = {m: v[None] for m, v in self.renderer.render(self.env.unwrapped.data).items()}
        if "proprio" in self.env_config.observation.modalities:
            observation["proprio"] = np.asarray(proprio, np.float32)[None]
        mean = self.model.mean_action(self.model.inputs(observation, torch.device("cpu")))
        actions = mean.reshape(-1, self.act_dim).numpy()
        return np.clip(actions, self.low, self.high) if self.env_config.clip_actions else actions
