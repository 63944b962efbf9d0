"""benchmarks/learning.py evaluates every implementation on one grid of env steps: m2flow's iteration's."""

import importlib
import json
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def learning(monkeypatch):
    """benchmarks/learning.py, imported as its script runs: its sibling modules importable by name."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("learning")


@pytest.mark.parametrize(
    ("config", "eval_every", "grid"),
    [
        (None, 10_000, 19 * 512),  # configs/ppo_mujoco.yaml: 2 replicas x 4 envs x 64 steps an iteration
        ("ppo_hopper.yaml", 30_000, 14 * 2048),  # 2 x 4 x 256
        ("ppo_hopper.yaml", 1_000, 2048),  # never below one iteration
    ],
)
def test_the_evaluation_grid_is_the_largest_multiple_of_m2flows_iteration_up_to_eval_every_and_one_at_least(
    learning, config, eval_every, grid
):
    assert learning.evaluation_grid("Hopper-v5", eval_every, [], learning.ALGOS["ppo"], config) == grid


def test_a_merge_records_the_evaluation_grid_only_where_every_part_was_evaluated_on_it(learning, tmp_path):
    def part(name, grid, implementation):
        args = {"algo": "ppo", "env": "Hopper-v5", "steps": 300_000, "eval_every": 30_000}
        args |= {"evaluation_grid": grid} if grid else {}
        run = {"implementation": implementation, "seed": 1, "curve": [], "wall_s": 1.0, "steps_per_s": 1.0}
        meta = {"commit": "c", "date": "d", "machine": "m"}
        (tmp_path / name).write_text(json.dumps({"args": args, "runs": [run], "meta": meta}))
        return str(tmp_path / name)

    shared, _, _ = learning.merge([part("a.json", 28_672, "m2flow"), part("b.json", 28_672, "sb3-cleanrl")])
    assert shared["evaluation_grid"] == 28_672
    apart, _, _ = learning.merge([part("c.json", 28_672, "m2flow"), part("d.json", None, "sb3-cleanrl")])
    assert "evaluation_grid" not in apart


def test_the_view_given_to_the_peers_is_the_camera_simulator_s_observation_and_none_for_state(learning):
    def view(config, settings=()):
        spec = learning.m2flow_spec("HalfCheetah-v5", 1, Path("."), list(settings), learning.ALGOS["ppo"], config)
        return learning.camera_view(*spec)

    assert view(None) is None  # configs/ppo_mujoco.yaml: state observations
    camera = {"cameras": ["track"], "modalities": ["rgb", "proprio"], "size": [84, 84]}
    assert view("ppo_mujoco_camera.yaml") == camera
    defaults = ["workers.env.args.observation={cameras: [track]}"]  # modalities and size left to their defaults
    assert view("ppo_mujoco_camera.yaml", defaults) == {"cameras": ["track"], "modalities": ["rgb"], "size": [84, 84]}
    depth = ["workers.env.args.observation.modalities=[rgb,depth]"]
    with pytest.raises(SystemExit, match=r"one camera's \['proprio', 'rgb'\]; .* \['track'\] x \['rgb', 'depth'\]"):
        view("ppo_mujoco_camera.yaml", depth)


def test_the_peers_pixel_wrapper_sees_the_image_m2flow_renders_and_the_raw_state(monkeypatch):
    """sb3_peer.Pixels (the peers' interpreter runs it; gymnasium and MuJoCo are all it needs) against
    m2flow's camera renderer with its fast profile, on the same physics state."""
    import gymnasium as gym

    import m2flow.workers.env  # noqa: F401  (picks the headless GL backend before MuJoCo is imported)
    from m2flow.workers.env.rendering import CameraRenderer

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    peer = importlib.import_module("sb3_peer")
    view = {"cameras": ["track"], "modalities": ["rgb", "proprio"], "size": [48, 64]}
    env = peer.Pixels(gym.make("HalfCheetah-v5", **peer.camera_kwargs(view)), view)
    seen, _ = env.reset(seed=1)
    for _ in range(5):
        seen, *_ = env.step(np.full(6, 0.5, np.float32))
    assert env.observation_space.contains(seen)
    np.testing.assert_array_equal(seen["proprio"], env.unwrapped._get_obs())
    model = env.unwrapped.model
    ours = CameraRenderer([model], ["track"], ["rgb"], (48, 64), "fast").render([env.unwrapped.data])["rgb"][0, 0]
    assert seen["rgb"].shape == (3, 48, 64) and seen["rgb"].dtype == np.uint8
    assert ours.std() > 10  # a scene, not a blank frame
    np.testing.assert_array_equal(seen["rgb"].transpose(1, 2, 0), ours)  # the same pixels


def test_a_merge_compared_at_fewer_steps_keeps_evaluations_up_to_them_and_refuses_runs_not_evaluated_there(learning):
    def run(name, last):
        curve = [{"steps": s, "wall_s": s / 100, "return": s / 10} for s in range(0, last + 1, 1000)]
        return {"implementation": name, "seed": 1, "curve": curve, "wall_s": last / 100, "steps_per_s": 100.0}

    recorded = {"steps": 5000, "seeds": [1]}
    cut, runs = learning.cut_at(recorded, [run("m2flow", 5000), run("sb3-zoo", 3000)], 3000)
    assert cut["steps"] == 3000 and cut["ran_steps"] == 5000
    assert [max(p["steps"] for p in r["curve"]) for r in runs] == [3000, 3000]
    with pytest.raises(SystemExit, match="not evaluated at 4000 env steps: sb3-zoo seed 1"):
        learning.cut_at(recorded, [run("m2flow", 5000), run("sb3-zoo", 3000)], 4000)
    with pytest.raises(SystemExit, match="not evaluated at 2500 env steps: m2flow seed 1, sb3-zoo seed 1"):
        learning.cut_at(recorded, [run("m2flow", 5000), run("sb3-zoo", 3000)], 2500)  # between evaluations
    with pytest.raises(SystemExit, match="beyond the 5000 steps"):
        learning.cut_at(recorded, [run("m2flow", 5000)], 6000)
