"""One Stable-Baselines3 run for `learning.py`, by the peers' own interpreter (their virtualenv: SB3, rl-zoo3,
gymnasium, MuJoCo; no m2flow): the algorithm set to rl-zoo3's tuned settings (`zoo`) or to CleanRL 1.2.0's
defaults (`cleanrl`), 10 deterministic evaluation episodes every EVERY env steps (evaluation time left out of
the wall time), the curve written to OUT as JSON after each evaluation (`complete` once the run ends), with
SB3's version and the policy's device.

With a camera VIEW (JSON; `null` for the state alone) the policy sees what m2flow's camera policy sees: the
camera's RGB image at the view's size (gymnasium's MuJoCo renderer, channels first, set to m2flow's fast
profile) beside the env's state vector (`proprio`), through `MultiInputPolicy`; VecNormalize normalises the
state only.

    python sb3_peer.py ENV_ID STEPS SEED EVERY OUT ALGO zoo|cleanrl VIEW
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np


class Pixels(gym.ObservationWrapper):
    """The view's modalities of a MuJoCo env made with `render_mode="rgb_array"` at the view's size and camera:
    `rgb` (uint8, channels first) and `proprio` (the env's own observation)."""

    def __init__(self, env: gym.Env, view: dict[str, Any]):
        super().__init__(env)
        model = env.unwrapped.model  # as workers/env/rendering.py's fast profile; set before the first render
        model.vis.quality.offsamples, model.vis.quality.shadowsize, model.mat_reflectance[:] = 0, 0, 0
        height, width = view["size"]
        spaces = {"rgb": gym.spaces.Box(0, 255, (3, height, width), np.uint8), "proprio": env.observation_space}
        self.modalities = view["modalities"]
        self.observation_space = gym.spaces.Dict({m: spaces[m] for m in self.modalities})

    def observation(self, state: np.ndarray) -> dict[str, np.ndarray]:
        seen = {"rgb": lambda: self.env.render().transpose(2, 0, 1).copy(), "proprio": lambda: state}
        return {m: seen[m]() for m in self.modalities}


def camera_kwargs(view: dict[str, Any]) -> dict[str, Any]:
    """What gymnasium's MuJoCo env is made with to render the view."""
    height, width = view["size"]
    return {"render_mode": "rgb_array", "width": width, "height": height, "camera_name": view["cameras"][0]}


def settings_of(kind: str, algo: str, env_id: str) -> tuple[dict[str, Any], dict[str, str], bool, int]:
    """(the algorithm's keyword arguments, them as text for the record, VecNormalize or not, envs)."""
    import torch.nn as nn
    import yaml

    if kind == "zoo":  # rl-zoo3's tuned file, read without importing the package (and its dependencies)
        from importlib.util import find_spec

        hyperparams = Path(find_spec("rl_zoo3").origin).parent / "hyperparams"
        zoo = yaml.safe_load((hyperparams / f"{algo.lower()}.yml").read_text())
        hp = dict(zoo[env_id.replace("-v5", "-v4")])
        normalize, n_envs = bool(hp.get("normalize", False)), hp.get("n_envs", 1)
        for k in ("n_timesteps", "policy", "normalize", "n_envs", "normalize_kwargs"):
            hp.pop(k, None)
        if isinstance(hp.get("policy_kwargs"), str):
            hp["policy_kwargs"] = eval(hp["policy_kwargs"], {"nn": nn, "dict": dict})
        return hp, {k: str(v) for k, v in hp.items()}, normalize, n_envs
    # CleanRL 1.2.0 ppo_continuous_action.py's defaults; SB3's own defaults give the rest (tanh 64x64, orthogonal
    # init, log-std 0, Adam eps 1e-5, per-minibatch advantage normalisation)
    hp = dict(
        n_steps=2048, batch_size=64, n_epochs=10, gamma=0.99, gae_lambda=0.95, clip_range=0.2, ent_coef=0.0,
        vf_coef=0.25, max_grad_norm=0.5,
    )  # fmt: skip
    described = {**{k: str(v) for k, v in hp.items()}, "learning_rate": "3e-4 annealed linearly to 0"}
    hp["learning_rate"] = lambda remaining: 3e-4 * max(remaining, 0.0)
    return hp, described, True, 1


def main() -> None:
    import stable_baselines3
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import VecNormalize, sync_envs_normalization

    env_id, steps, seed, every, out, algo, kind = sys.argv[1], *map(int, sys.argv[2:5]), *sys.argv[5:8]
    view = json.loads(sys.argv[8])
    hp, described, normalize, n_envs = settings_of(kind, algo, env_id)
    made, policy, observed = {}, "MlpPolicy", {}
    if view:
        made = {"env_kwargs": camera_kwargs(view), "wrapper_class": Pixels, "wrapper_kwargs": {"view": view}}
        policy = "MultiInputPolicy"
        proprio = "proprio" in view["modalities"]
        observed = {"norm_obs_keys": ["proprio"]} if proprio else {"norm_obs": False}  # the images are the CNN's
    env = make_vec_env(env_id, n_envs=n_envs, seed=seed, **made)
    evaluation = make_vec_env(env_id, n_envs=1, seed=seed + 10_000, **made)
    if normalize:
        env = VecNormalize(env, gamma=hp.get("gamma", 0.99), **observed)
        evaluation = VecNormalize(evaluation, training=False, norm_reward=False, **observed)

    class Evaluate(BaseCallback):
        """Evaluates every `every` env steps, inside rollout collection (before that rollout's update), and
        writes the curve so far: a run cut short keeps it."""

        def __init__(self):
            super().__init__()
            self.curve, self.start, self.next = [], time.time(), 0

        def _on_step(self) -> bool:
            if self.num_timesteps >= self.next:
                wall = time.time() - self.start
                if normalize:
                    sync_envs_normalization(self.training_env, evaluation)
                mean, _ = evaluate_policy(self.model, evaluation, n_eval_episodes=10, deterministic=True)
                self.curve.append({"steps": self.num_timesteps, "wall_s": wall, "return": float(mean)})
                self.start += time.time() - self.start - wall  # evaluation time is not training time
                self.next += every
                self.write(wall, complete=False)
            return True

        def write(self, wall: float, complete: bool) -> None:
            ran = {"sb3": stable_baselines3.__version__, "device": str(self.model.device)}
            record = {"curve": self.curve, "wall_s": wall, "hyperparameters": described, "complete": complete}
            Path(out).write_text(json.dumps({**record, **ran}))

    callback = Evaluate()
    model = getattr(stable_baselines3, algo)(policy, env, seed=seed, verbose=0, **hp)
    model.learn(steps + 1, callback=callback)
    callback.write(time.time() - callback.start, complete=True)  # evaluations left out


if __name__ == "__main__":
    main()
