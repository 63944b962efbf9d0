"""Evaluation episodes inside a simulator's process: the policy's deterministic (mean) action, on an env of
their own — the training envs, their RNGs and episodes are untouched — each episode filmed when the
simulator's `video.save` is on.

Driven by a sync edge, so it runs every k iterations with the weights of that moment:

    sync: [{edge: actor.weights -> env.evaluate, every: 10}]

The simulator's first replica evaluates (on its first slice); the edge sends the weights to it alone
(`EVALUATE_DISPATCH`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

import m2flow
from m2flow.strict_numbers import NumbersNotBooleans
from m2flow.workers.env.spaces import camera_refusal
from m2flow.workers.env.video import VideoConfig

if TYPE_CHECKING:
    import gymnasium as gym

    from m2flow.workers.env.video import EpisodeVideo

Observe = Callable[[np.ndarray], dict[str, np.ndarray]]  # the env's observation -> the policy's input (batch of 1)
EVALUATE_DISPATCH = {"evaluate": m2flow.Dispatch(split="first")}  # a simulator's `port_dispatch`: the first evaluates


class EvaluationConfig(NumbersNotBooleans):
    model_config = ConfigDict(extra="forbid")

    policy: dict[str, Any] = Field(description="the policy's args, as the inference worker's (TorchPolicy)")
    episodes: int = Field(1, ge=1, description="episodes per evaluation")
    max_steps: int = Field(1000, ge=1, description="env steps per episode at most")
    seed: int = Field(10_000, description="episode e starts from seed run.seed + seed + e")

    @field_validator("policy")
    @classmethod
    def _a_policy(cls, policy: dict[str, Any]) -> dict[str, Any]:
        """Checked as the inference worker's args are (the policy package imports this one: imported here)."""
        from m2flow.workers.rollout.torch_policy import TorchPolicyConfig

        try:
            TorchPolicyConfig.model_validate(policy)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise ValueError(f"not the args of a policy: {problems}") from None
        return policy


class Evaluated(NumbersNotBooleans):
    """A simulator config's evaluation settings: what `evaluate(weights)` plays, and whether it films it."""

    evaluation: EvaluationConfig | None = Field(None, description="deterministic episodes for `evaluate`")
    video: VideoConfig = Field(default_factory=VideoConfig, description="film the evaluation episodes")

    def agreeing(self, phase: str, port: str) -> dict[str, m2flow.Agreed]:
        """At `evaluate`'s sync edge, what the evaluation policy's args give: the weights arrive there. (Before
        `m2flow.WorkerConfig` among a Config's bases, so that this comes first.)"""
        if (phase, port) != ("sync", "evaluate") or self.evaluation is None:
            return super().agreeing(phase, port)
        from m2flow.workers.rollout.torch_policy import TorchPolicyConfig

        policy = TorchPolicyConfig.model_validate(self.evaluation.policy).agreeing(phase, port)
        return {name: m2flow.Agreed(f"evaluation.policy.{a.key}", a.value) for name, a in policy.items()}

    @model_validator(mode="after")
    def _evaluated_in_its_env(self) -> Evaluated:
        env_id = getattr(self, "env_id", None)  # the simulator's own
        policy_env = self.evaluation.policy.get("env_id") if self.evaluation is not None else None
        if env_id is not None and policy_env is not None and policy_env != env_id:
            raise ValueError(
                f"evaluation.policy.env_id: the evaluation policy acts in this simulator's env ({env_id!r}), not"
                f" in {policy_env!r}; give it the same"
            )
        return self

    @model_validator(mode="after")
    def _filmed_by_a_camera_of_the_model(self) -> Evaluated:
        if self.video.camera is not None and (env_id := getattr(self, "env_id", None)) is not None:
            env_kwargs = getattr(self, "env_kwargs", {})
            if why := camera_refusal(env_id, env_kwargs, "video.camera", [self.video.camera]):
                raise ValueError(why)
        return self

    @model_validator(mode="after")
    def _video_films_evaluations(self) -> Evaluated:
        if self.video.save and self.evaluation is None:
            raise ValueError(
                "video.save films evaluation episodes: add `evaluation: {policy: <the policy's args>}` and a"
                " sync edge `actor.weights -> env.evaluate` (with `every: k`)"
            )
        return self


class Evaluator:
    def __init__(
        self,
        config: EvaluationConfig,
        env: gym.Env,
        observe: Observe,
        seed: int,
        clip_actions: bool = True,
        video: EpisodeVideo | None = None,
    ):
        """`env`: an env of the evaluation's own; `observe`: what the policy reads of its observation."""
        # the policy's package imports the env package: import here, not at the top
        from m2flow.workers.rollout.torch_policy import TorchPolicyConfig

        self.config, self.env, self.observe, self.video = config, env, observe, video
        self.seed = seed + config.seed
        self.model = TorchPolicyConfig(**config.policy).build().eval()
        space = env.action_space
        self.low, self.high, self.act_dim = space.low, space.high, int(np.prod(space.shape))
        self.clip_actions = clip_actions

    def run(self, weights: dict[str, Any]) -> dict[str, float]:
        from m2flow.workers.models.checksum import checksum_matches

        if not checksum_matches(weights["state"], weights["checksum"]):
            raise ValueError("evaluate: the weights do not match their checksum (a torn update); not evaluated")
        self.model.load_state_dict(weights["state"])
        results = [self._episode(weights["version"], e) for e in range(self.config.episodes)]
        returns, lengths, successes = (np.array(column, dtype=np.float64) for column in zip(*results, strict=True))
        metrics = {
            "eval/return": float(returns.mean()),
            "eval/return_std": float(returns.std()),
            "eval/length": float(lengths.mean()),
        }
        if not np.isnan(successes).all():
            metrics["eval/success"] = float(np.nanmean(successes))
        return metrics

    def _episode(self, version: int, episode: int) -> tuple[float, int, float]:
        observation = self.env.reset(seed=self.seed + episode)[0]
        total, steps, success, done = 0.0, 0, np.nan, False
        while not done:
            for action in self._act(observation):
                observation, reward, terminated, truncated, info = self.env.step(action)
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

    def _act(self, observation: np.ndarray) -> np.ndarray:
        """The chunk of mean actions for the current observation (as the policy sees it in training)."""
        import torch

        with torch.no_grad():
            mean = self.model.mean_action(self.model.inputs(self.observe(observation), torch.device("cpu")))
            actions = mean.reshape(-1, self.act_dim).numpy()
            return np.clip(actions, self.low, self.high) if self.clip_actions else actions
