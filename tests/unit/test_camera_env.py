"""Camera simulators: chunks, observations only where read, only the requested modalities."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from m2flow.context import WorkerContext, set_context
from m2flow.workers.env import CameraEnv
from m2flow.workers.env.env_ids import make_env


@pytest.fixture(autouse=True)
def four_envs():
    set_context(WorkerContext(items=(0, 4), seed=3))
    yield
    set_context(WorkerContext())


def cheetah(**overrides) -> CameraEnv:
    args = {
        "env_id": "HalfCheetah-v5",
        "num_envs": 4,
        "chunk": 4,
        "env_kwargs": {"max_episode_steps": 10},
        "observation": {"cameras": ["track"], "modalities": ["rgb", "proprio"], "size": [32, 32]},
    }
    return CameraEnv(**{**args, **overrides})


def chunk_actions(chunks: int) -> list[np.ndarray]:
    """The actions `run` sends: [envs, chunk, action] per step."""
    rng = np.random.default_rng(0)
    return [rng.uniform(-1, 1, size=(4, 4, 6)).astype(np.float32) for _ in range(chunks)]


def run(env: CameraEnv, chunks: int = 6) -> dict:
    env.obs()
    for action in chunk_actions(chunks):
        env.step({"action": action})
    return env.trajectory()


def test_chunk_end_and_every_step_observations_give_identical_physics():
    lazy, eager = cheetah(), cheetah(obs_every_step=True)
    a, b = run(lazy), run(eager)
    np.testing.assert_array_equal(a["reward"], b["reward"])
    np.testing.assert_array_equal(a["done"], b["done"])
    np.testing.assert_array_equal(a["obs"]["proprio"], b["obs"]["proprio"])
    np.testing.assert_array_equal(a["obs"]["rgb"], b["obs"]["rgb"])
    for x, y in zip(lazy.envs, eager.envs, strict=True):
        np.testing.assert_array_equal(x.unwrapped.data.qpos, y.unwrapped.data.qpos)
    # one render per env at the start and per chunk, against one per physics step
    assert lazy.render_calls == {"rgb": 4 * (1 + 6)}
    assert eager.render_calls == {"rgb": 4 * (1 + 6 + 6 * 4)}


def test_an_episode_ending_inside_a_chunk_idles_and_restarts_at_the_chunk_end():
    env = cheetah()
    batch = run(env, chunks=4)  # 10-step episodes, 4-step chunks: chunks of 4, 4, 2 (+2 idle), then new
    assert batch["done"][:, 0].tolist() == [0, 0, 0, 1]  # obs of chunk 3 began the second episode
    assert env.metrics()["env/episode_len"] == 10


def test_only_requested_modalities_are_rendered():
    env = cheetah(observation={"cameras": ["track"], "modalities": ["depth"], "size": [16, 24]})
    batch = run(env, chunks=2)
    assert set(batch["obs"]) == {"depth", "env_id"}
    assert batch["obs"]["depth"].shape == (2, 4, 1, 16, 24)
    assert env.render_calls == {"depth": 4 * 3}


def test_an_unknown_camera_names_the_ones_there_are():
    with pytest.raises(ValueError, match=r"cameras \['front'\] are not in this model \(it has: track\)"):
        cheetah(observation={"cameras": ["front"]})


def test_group_members_start_from_the_same_state():
    env = cheetah(group_size=2)
    first = env.obs()["proprio"]
    np.testing.assert_array_equal(first[0], first[1])
    assert not np.array_equal(first[0], first[2])


VISION = {
    "env_id": "HalfCheetah-v5",
    "model": "cnn",
    "hidden": [64],
    "chunk": 4,
    "env_kwargs": {"max_episode_steps": 10},
    "observation": {"cameras": ["track"], "modalities": ["rgb", "proprio"], "size": [40, 40]},
}


@pytest.mark.parametrize("advantage", ["gae", "grpo"])
def test_a_vision_policy_drives_chunks_and_trains_on_them(advantage):
    from m2flow.workers.actor import PPO
    from m2flow.workers.rollout import TorchPolicy

    env = cheetah(observation=VISION["observation"], group_size=2)
    policy = TorchPolicy(**VISION)
    actor = PPO(**VISION, num_minibatches=2, update_epochs=2, advantage=advantage, group_size=2)
    initial = actor.weights()["state"]
    policy.load_weights(actor.weights())
    obs = env.obs()
    for _ in range(5):
        out = policy.act(obs)
        assert out["action"].shape == (4, 4 * 6)  # a chunk of 4 six-dim actions per env
        obs = env.step(out)
    metrics = actor.train([env.trajectory()])
    assert metrics["actor/steps_consumed"] == 5 * 4
    assert np.isfinite(metrics["actor/loss"]) and metrics["actor/weights_version"] == 1
    after = actor.weights()["state"]
    assert any(not torch.equal(initial[k], after[k]) for k in initial), "the update must move the weights"


def test_ppo_on_cameras_trains_on_batches_with_and_without_an_episode_a_time_limit_cut():
    from m2flow.workers.actor import PPO
    from m2flow.workers.rollout import TorchPolicy

    env = cheetah(observation=VISION["observation"], bootstrap_time_limits=True)  # 10-step episodes, chunks of 4
    policy = TorchPolicy(**VISION)
    actor = PPO(**VISION, num_minibatches=2, update_epochs=1)
    obs = env.obs()
    for steps, cuts in ((2, 0), (2, 4)):  # env steps 1-8: none cut; 9-16: the 10-step limit cuts all 4 episodes
        for _ in range(steps):
            obs = env.step(policy.act(obs))
        trajectory = env.trajectory()
        assert trajectory["truncated"].sum() == cuts and set(trajectory["final_obs"]) == {"rgb", "proprio"}
        metrics = actor.train([trajectory])
        assert np.isfinite(metrics["actor/loss"]) and metrics["actor/steps_consumed"] == steps * 4


def evaluation_weights(policy: dict, version: int = 1) -> dict:
    from m2flow.workers.models import PolicyArgs
    from m2flow.workers.models.checksum import state_checksum

    torch.manual_seed(0)
    state = PolicyArgs(**policy).build().state_dict()
    return {"version": version, "state": state, "checksum": state_checksum(state)}


@pytest.mark.parametrize("fmt", ["mp4", "gif"])
def test_evaluation_episodes_are_filmed_and_leave_training_untouched(tmp_path, fmt):
    import imageio.v2 as imageio

    set_context(WorkerContext(worker="env", items=(0, 4), seed=3, output_dir=str(tmp_path)))
    view = {"cameras": ["track"], "modalities": ["rgb", "proprio"], "size": [36, 36]}
    policy = {"env_id": "HalfCheetah-v5", "model": "cnn", "hidden": [32], "chunk": 4, "observation": view}
    evaluation = {"policy": policy, "episodes": 2, "max_steps": 10}
    env = cheetah(observation=view, evaluation=evaluation, video={"save": True, "size": [48, 64], "format": fmt})
    plain = cheetah(observation=view)
    pristine = make_env("HalfCheetah-v5").unwrapped.model
    filmed = env.evaluator.video.renderer.models[0]
    assert filmed.vis.quality.shadowsize == pristine.vis.quality.shadowsize > 0, "videos render in full, shadows on"
    assert env.renderer.models[0].vis.quality.shadowsize == 0, "training renders fast"
    first = run(env, chunks=3)
    env.evaluate(evaluation_weights(policy, version=7))
    second = run(env, chunks=3)
    metrics = env.metrics()
    assert metrics["eval/length"] == 10 and np.isfinite(metrics["eval/return"])
    assert "eval/return" not in env.metrics(), "an evaluation is reported once"
    videos = sorted((tmp_path / "videos" / "env").iterdir())
    assert [v.name for v in videos] == [f"eval_v00007_episode{e}.{fmt}" for e in (0, 1)]
    frames = imageio.mimread(videos[0])
    assert len(frames) == 10 and frames[0].shape[:2] == (48, 64)
    reference = [run(plain, chunks=3), run(plain, chunks=3)]
    for got, want in zip([first, second], reference, strict=True):
        for key in ("reward", "done", "action"):
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
        for modality in ("rgb", "proprio"):  # the training observations are rendered as if nothing happened
            np.testing.assert_array_equal(got["obs"][modality], want["obs"][modality], err_msg=modality)


def test_evaluation_takes_weights_whose_checksum_was_summed_in_another_order():
    """A training worker on a GPU sums the checksum there, in another order than the evaluator's CPU."""
    view = {"cameras": ["track"], "modalities": ["rgb", "proprio"], "size": [36, 36]}
    policy = {"env_id": "HalfCheetah-v5", "model": "cnn", "hidden": [32], "chunk": 4, "observation": view}
    env = cheetah(observation=view, evaluation={"policy": policy, "max_steps": 4})
    weights = evaluation_weights(policy)
    env.evaluate({**weights, "checksum": weights["checksum"] * (1 + 1e-12)})
    assert "eval/return" in env.metrics()


def test_evaluation_refuses_torn_weights_and_video_needs_an_evaluation():
    view = {"cameras": ["track"], "modalities": ["rgb", "proprio"], "size": [36, 36]}
    policy = {"env_id": "HalfCheetah-v5", "model": "cnn", "hidden": [32], "chunk": 4, "observation": view}
    env = cheetah(observation=view, evaluation={"policy": policy, "max_steps": 4})
    weights = evaluation_weights(policy)
    key = next(iter(weights["state"]))
    weights["state"][key] = weights["state"][key] + 1
    with pytest.raises(ValueError, match="torn"):
        env.evaluate(weights)
    with pytest.raises(ValueError, match="video.save films evaluation episodes"):
        cheetah(video={"save": True})


def test_an_egl_device_that_cannot_be_opened_is_explained_with_what_egl_needs():
    import subprocess
    import sys

    code = (
        "from m2flow.workers.env.rendering import CameraRenderer\n"
        "from m2flow.workers.env.env_ids import make_env\n"
        "CameraRenderer([make_env('HalfCheetah-v5').unwrapped.model], ['track'], ['rgb'], (16, 16), 'fast')\n"
    )
    env = {**os.environ, "MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl", "MUJOCO_EGL_DEVICE_ID": "99"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode != 0
    assert "MuJoCo could not make a GL context (MUJOCO_GL=egl)" in out.stderr
    assert "on EGL device 99 (MUJOCO_EGL_DEVICE_ID: the plan's render GPU, or yours)" in out.stderr
    assert "EGL's vendor files here:" in out.stderr and "10_nvidia.json" in out.stderr


def test_metrics_split_the_step_s_time_into_physics_and_rendering_since_the_last_report():
    env = cheetah()
    run(env, chunks=2)
    first = env.metrics()
    assert first["env/physics_s"] > 0 and first["env/render_s"] > 0
    second = env.metrics()
    assert second["env/physics_s"] == second["env/render_s"] == 0.0, "each report covers the time since the last"


def test_proprioception_is_normalised_per_env_and_its_statistics_resume_and_evaluate_frozen():
    import gymnasium as gym

    from m2flow.workers.env.obs_statistics import merged_statistics, normalizers

    view = {"cameras": ["track"], "modalities": ["rgb", "proprio"], "size": [36, 36]}
    policy = {"env_id": "HalfCheetah-v5", "model": "cnn", "hidden": [32], "chunk": 4, "observation": view}
    long_episodes = {"max_episode_steps": 1000}
    env = cheetah(observation=view, evaluation={"policy": policy, "max_steps": 8}, env_kwargs=long_episodes)
    raw = cheetah(observation=view, normalize_obs=False, env_kwargs=long_episodes)
    normalised, plain = run(env), run(raw)
    np.testing.assert_array_equal(normalised["obs"]["rgb"], plain["obs"]["rgb"])  # images are the policy's
    assert not np.allclose(normalised["obs"]["proprio"], plain["obs"]["proprio"])
    reference = gym.wrappers.NormalizeObservation(make_env("HalfCheetah-v5"))  # env 0, as CleanRL wraps it
    reference.reset(seed=env.seeds[0])
    for chunk in chunk_actions(6):
        for action in chunk[0]:  # env 0's 4 actions of the chunk, each a physics step the statistics see
            expected = reference.step(action)[0]
    np.testing.assert_allclose(env.obs()["proprio"][0], np.clip(expected, -10, 10), rtol=1e-4, atol=1e-5)
    rms = normalizers(env.envs)
    assert len({id(r.obs_rms) for r in rms}) == 4  # one running mean per env

    resumed = cheetah(observation=view, env_kwargs=long_episodes)
    resumed.load_state_dict(env.state_dict())
    action = {"action": np.full((4, 4, 6), 0.3, np.float32)}
    np.testing.assert_array_equal(resumed.step(action)["proprio"], env.step(action)["proprio"])

    counts = [r.obs_rms.count for r in rms]
    env.evaluate(evaluation_weights(policy))
    assert "eval/return" in env.metrics()
    assert [r.obs_rms.count for r in rms] == counts, "evaluation does not update the training statistics"
    (frozen,) = normalizers([env.evaluator.env])
    mean, _, count = merged_statistics(env.envs)
    np.testing.assert_allclose(frozen.obs_rms.mean, mean)
    assert frozen.obs_rms.count == count and not frozen.update_running_mean


def test_a_camera_simulator_started_anew_keeps_the_proprioception_statistics_only_where_it_normalises():
    env = cheetah()
    run(env, chunks=2)
    assert cheetah().load_statistics(env.state_dict())
    assert not cheetah().load_statistics({})  # a state before any step holds none
    unread = cheetah(observation={"cameras": ["track"], "modalities": ["rgb"], "size": [32, 32]})
    assert not unread.normalizes and not unread.load_statistics(env.state_dict())  # the policy reads no proprio


def test_a_checkpoint_normalised_otherwise_than_the_simulator_is_refused_naming_normalize_obs():
    from m2flow.errors import SpecError

    set_context(WorkerContext(worker="env", items=(0, 4), seed=3))
    raw = cheetah(normalize_obs=False)
    run(raw, chunks=2)
    with pytest.raises(SpecError, match=r"workers\.env\.args\.normalize_obs: .* set normalize_obs: false"):
        cheetah().load_state_dict(raw.state_dict())
    cheetah(normalize_obs=False).load_state_dict(raw.state_dict())  # as it was trained: resumes
    normalised = cheetah()
    run(normalised, chunks=2)
    with pytest.raises(SpecError, match=r"simulator normalised the proprioception; set normalize_obs: true"):
        cheetah(normalize_obs=False).load_state_dict(normalised.state_dict())
