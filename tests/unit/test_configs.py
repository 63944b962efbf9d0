"""Every workflow in configs/ validates and plans — on this machine's kind and on a GPU machine's."""

from __future__ import annotations

import importlib.util
import re

import pytest
import yaml

from m2flow.cluster import Cluster
from m2flow.config import load_spec
from m2flow.graph import build_graph
from m2flow.planners import make_plan
from tests.conftest import ON_CPU, ROOT

CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory):
    from m2flow.workers.models.hf_tiny import make_tiny_vlm

    return make_tiny_vlm(tmp_path_factory.mktemp("models") / "tiny-vlm")


def overrides_for(config, cluster: str, tiny_vlm) -> list[str]:
    if config.name == "ppo_hf_tiny.yaml":  # its model is written by a setup step: here, to a temporary folder
        return [f"workers.{w}.args.hf.path={tiny_vlm}" for w in ("rollout", "actor")]
    return ON_CPU.get(config.name, []) if "gpus=0" in cluster else []


@pytest.mark.parametrize("cluster", ["cluster.cpus=2 cluster.gpus=0", "cluster.cpus=16 cluster.gpus=1"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_every_config_validates_and_plans(config, cluster, tiny_vlm):
    if "robosuite" in config.name and importlib.util.find_spec("robosuite") is None:
        pytest.skip("the robosuite extra is not installed (pip install m2flow[robosuite])")
    spec = load_spec(config, [*cluster.split(), *overrides_for(config, cluster, tiny_vlm)])
    plan = make_plan(build_graph(spec, str(config)), Cluster.from_spec(spec.cluster))
    assert plan.predicted.iteration_s > 0
    assert set(plan.placements) == set(spec.workers)


def test_the_readme_shows_the_main_job_as_it_is_in_configs():
    readme = (ROOT / "README.md").read_text()
    shown = re.search(r"`configs/ppo_mujoco.yaml`, the main job:\n\n```yaml\n(.*?)```", readme, flags=re.S)
    assert shown, "README.md no longer shows the main job's YAML"
    assert yaml.safe_load(shown.group(1)) == yaml.safe_load((ROOT / "configs" / "ppo_mujoco.yaml").read_text())
