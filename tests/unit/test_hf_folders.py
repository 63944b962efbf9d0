"""Hugging Face model folders (`model: hf`) that cannot be used, named before anything starts: a missing or
incomplete folder, a model family m2flow does not take, head settings the model cannot carry, model code the
folder brings without `trust_remote_code`, an export reloaded with other settings, LoRA targets that name no
layer, a checkpoint left as a Git LFS pointer, and the `hf` extra not installed. On tiny random models the tests
write themselves (no hub)."""

from __future__ import annotations

import json
import shutil

import pytest

from m2flow.config import spec_from_dict
from m2flow.context import WorkerContext, set_context
from m2flow.errors import SpecError
from m2flow.graph import build_graph
from m2flow.workers.models.hf_tiny import make_tiny_vlm
from m2flow.workers.rollout import TorchPolicy
from tests.unit.test_hf import observation, pair, policy_args


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm") / "model")


def problems(folder, **hf) -> str:
    raw = {
        "name": "hf",
        "workers": {
            "policy": {
                "kind": "inference",
                "class": "m2flow.workers.rollout.TorchPolicy",
                "args": policy_args(folder, **hf),
            }
        },
    }
    with pytest.raises(SpecError) as info:
        build_graph(spec_from_dict(raw))
    return str(info.value)


def test_every_bad_model_folder_is_named_before_anything_starts(folder, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    assert "no folder" in problems(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    assert "has no config.json" in problems(tmp_path / "empty")
    LlamaForCausalLM(
        LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, vocab_size=64)
    ).save_pretrained(tmp_path / "text-only")
    assert "holds a 'llama' model" in problems(tmp_path / "text-only")
    from transformers import PaliGemmaConfig

    PaliGemmaConfig().save_pretrained(tmp_path / "paligemma")  # a VLM of another family: its config is enough
    assert "holds a 'paligemma' model; m2flow's hf policies take LLaVA models" in problems(tmp_path / "paligemma")
    assert "action_bins: 300 bins need a vocabulary of more than 600 tokens" in problems(
        folder, head="tokens", action_bins=300
    )
    weights_only = tmp_path / "weights-only"
    weights_only.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(folder / name, weights_only / name)
    assert "has no tokenizer" in problems(weights_only)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(folder / name, weights_only / name)
    assert "has no image processor config" in problems(weights_only)
    assert "a deterministic (regression) head cannot be trained by PPO or GRPO" in problems(folder, head="regression")
    assert "lm_head: the action bins are read from the output embedding's weights directly" in problems(
        folder, lora={"target_modules": ["q_proj", "lm_head"]}
    )


def custom_code_folder(folder, tmp_path):
    """The tiny VLM under a model type of its own, whose config and model classes are code in the folder."""
    remote = tmp_path / "remote"
    shutil.copytree(folder, remote)
    (remote / "configuration_m2test.py").write_text(
        "from transformers import LlavaConfig\n\n\nclass M2TestConfig(LlavaConfig):\n    model_type = 'm2test_llava'\n"
    )
    (remote / "modeling_m2test.py").write_text(
        "from transformers import LlavaForConditionalGeneration\n\nfrom .configuration_m2test import M2TestConfig\n\n\n"
        "class M2TestLlava(LlavaForConditionalGeneration):\n    config_class = M2TestConfig\n"
    )
    config = json.loads((remote / "config.json").read_text())
    config["model_type"] = "m2test_llava"
    config["auto_map"] = {
        "AutoConfig": "configuration_m2test.M2TestConfig",
        "AutoModelForImageTextToText": "modeling_m2test.M2TestLlava",
    }
    (remote / "config.json").write_text(json.dumps(config))
    return remote


def test_a_folder_with_its_own_code_needs_trust_remote_code_and_then_runs_that_code(folder, tmp_path):
    remote = custom_code_folder(folder, tmp_path)
    assert "brings its own model code (config.json's auto_map); set trust_remote_code: true" in problems(remote)
    set_context(WorkerContext(worker="rollout", kind="inference", seed=1))
    policy = TorchPolicy(**policy_args(remote, trust_remote_code=True))
    assert type(policy.model.backbone).__name__ == "M2TestLlava"
    assert policy.act(observation())["action"].shape == (4, 6)


def test_a_folder_with_its_own_code_is_validated_with_one_load_of_its_config(folder, tmp_path, monkeypatch):
    import transformers

    from m2flow.workers.models.hf_options import HFOptions

    remote = custom_code_folder(folder, tmp_path)
    loads, load = [], transformers.AutoConfig.from_pretrained
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", lambda *a, **k: loads.append(a) or load(*a, **k))
    HFOptions(path=str(remote), trust_remote_code=True, head="tokens", action_bins=8)  # validated as it is made
    assert len(loads) == 1  # its family and its vocabulary from one load


def test_an_export_reloaded_with_other_head_settings_is_refused_naming_them(folder, tmp_path):
    actor, _ = pair(folder, head="tokens", action_bins=32, instruction="open the drawer")
    actor.export(str(tmp_path / "exported"))
    with pytest.raises(
        ValueError, match="was exported with head: 'tokens', action_bins: 32, instruction: 'open the drawer'"
    ):
        TorchPolicy.Config(**policy_args(tmp_path / "exported"))
    settings = {"head": "tokens", "action_bins": 32, "instruction": "open the drawer"}
    with pytest.raises(ValueError, match="was exported for 6 action values per call; this policy emits 24"):
        TorchPolicy.Config(**{**policy_args(tmp_path / "exported", **settings), "chunk": 4})


def test_without_the_hf_extra_the_options_say_what_to_install(folder, monkeypatch):
    from m2flow.errors import MissingDependency
    from m2flow.workers.models import hf_options

    real = hf_options.find_spec
    monkeypatch.setattr(hf_options, "find_spec", lambda name: None if name == "peft" else real(name))
    with pytest.raises(MissingDependency, match=r"pip install 'm2flow\[hf\]'"):
        hf_options.HFOptions(path=str(folder))


def test_lora_targets_match_as_peft_does_and_a_target_that_names_no_layer_is_named(folder):
    from m2flow.workers.models import PolicyArgs
    from m2flow.workers.models.hf_folder import folder_size
    from m2flow.workers.models.policy_args import camera_inputs

    def adapter_bytes(targets: list[str]) -> int:
        args = PolicyArgs(**policy_args(folder, lora={"r": 2, "target_modules": targets}))
        without = folder_size(args.hf.model_copy(update={"lora": None}), camera_inputs(args))
        return folder_size(args.hf, camera_inputs(args)).bytes - without.bytes

    assert adapter_bytes(["self_attn.q_proj"]) == adapter_bytes(["q_proj"]) > 0  # a dotted suffix, as peft accepts
    with pytest.raises(ValueError, match=r"lora.target_modules: none of \['qproj'\] names a linear layer"):
        adapter_bytes(["qproj"])


def test_a_checkpoint_left_as_a_git_lfs_pointer_is_named(folder, tmp_path):
    from m2flow.workers.models.hf_folder import tensor_shapes

    copy = shutil.copytree(folder, tmp_path / "model")
    (copy / "model.safetensors").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:ab\nsize 9\n")
    with pytest.raises(ValueError, match="is not a safetensors file .a Git LFS pointer not pulled"):
        tensor_shapes(copy)
