"""`model: hf` settings (`HFOptions`) and what can be checked from the model's folder alone: its config,
tokenizer and exported heads. No torch here: transformers (which imports torch) only for a folder that brings its
own model code, or whose config leaves the vocabulary's size to its class's defaults."""

from __future__ import annotations

import json
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from m2flow.errors import MissingDependency
from m2flow.strict_numbers import NumbersNotBooleans
from m2flow.workers.models.precision import Precision

HEADS_FILE = "m2flow_policy.json"  # what `m2flow export` adds beside the backbone: the heads' settings...
HEADS_WEIGHTS = "m2flow_heads.safetensors"  # ...and their weights


class LoraOptions(NumbersNotBooleans):
    model_config = ConfigDict(extra="forbid")

    r: int = Field(8, ge=1, description="the adapters' rank")
    alpha: int = Field(16, ge=1)
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "v_proj"])

    @field_validator("target_modules")
    @classmethod
    def _not_the_output_head(cls, modules: list[str]) -> list[str]:
        if "lm_head" in modules:
            raise ValueError(
                "lm_head: the action bins are read from the output embedding's weights directly, so an adapter"
                " there would do nothing; adapt the decoder's projections instead"
            )
        return modules


class HFOptions(NumbersNotBooleans):
    """`model: hf` settings of a policy (its args)."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="a local folder with a transformers checkpoint (config, safetensors, processor)")
    head: Literal["gaussian", "tokens"] = "gaussian"
    action_bins: int = Field(256, ge=2, description="tokens head: the last N vocabulary tokens are the bins")
    instruction: str = Field("", description="the task's instruction, after the image in the prompt")
    dtype: Precision = Field("fp32", description="the backbone's weights as loaded")
    trust_remote_code: bool = Field(False, description="run the model folder's own code (only for folders you trust)")
    lora: LoraOptions | None = Field(None, description="train low-rank adapters instead of the backbone")

    @field_validator("head", mode="before")
    @classmethod
    def _stochastic(cls, head: Any) -> Any:
        if head in ("regression", "deterministic", "l1", "mse"):
            raise ValueError(
                f"{head!r}: a deterministic (regression) head cannot be trained by PPO or GRPO, which need the"
                " probability of the action taken; use head: gaussian (the regressed mean with a learnable"
                " log-std, as OpenVLA-OFT's head under RL) or head: tokens"
            )
        return head

    @model_validator(mode="after")
    def _checked(self) -> HFOptions:
        check_folder(self)
        return self


def installed() -> None:
    """The hf extra is installed (found, not imported: importing transformers imports torch)."""
    if any(find_spec(package) is None for package in ("transformers", "accelerate", "peft")):
        raise MissingDependency("model: hf needs transformers, accelerate and peft: pip install 'm2flow[hf]'")


def _loaded_config(options: HFOptions) -> Any:
    return transformers().AutoConfig.from_pretrained(options.path, trust_remote_code=options.trust_remote_code)


def transformers():
    """The transformers package, or the extra to install for it."""
    try:
        import transformers
    except ImportError:
        raise MissingDependency("model: hf needs transformers, accelerate and peft: pip install 'm2flow[hf]'") from None
    return transformers


def check_folder(options: HFOptions) -> None:
    """What can be known before building: the folder, its config, a supported family, the processor, the
    vocabulary's room for the action bins. ValueError saying which, for the spec's validation."""
    folder = Path(options.path)
    if not folder.is_dir():
        raise ValueError(f"path: no folder {folder}; point it at a local transformers checkpoint (no hub is used)")
    installed()
    if not (folder / "config.json").exists():
        raise ValueError(
            f"path: {folder} has no config.json: not a transformers checkpoint (save_pretrained writes one)"
        )
    written = read_config(folder)
    if "auto_map" in written and not options.trust_remote_code:
        raise ValueError(
            f"path: {folder} brings its own model code (config.json's auto_map); set trust_remote_code: true to"
            " run it, only for a folder you trust"
        )
    remote = "auto_map" in written  # its config class is the folder's own: only transformers can say what it is
    loaded = _loaded_config(options) if remote else None  # loaded once: it runs the folder's code
    llava = isinstance(loaded, transformers().LlavaConfig) if remote else written.get("model_type") == "llava"
    if not llava:
        raise ValueError(
            f"path: {folder} holds a {written.get('model_type')!r} model; m2flow's hf policies take LLaVA models"
            " (model_type llava, or a config class derived from LlavaConfig): one image through a vision tower"
            " of fixed image and patch size, a projector and a decoder"
        )
    if not any((folder / name).exists() for name in ("tokenizer.json", "tokenizer_config.json")):
        raise ValueError(f"path: {folder} has no tokenizer: save the processor there too (processor.save_pretrained)")
    if not (folder / "processor_config.json").exists() and not (folder / "preprocessor_config.json").exists():
        raise ValueError(f"path: {folder} has no image processor config: save the processor there too")
    settings = exported_settings(options)
    if settings is not None:  # `m2flow export` wrote the folder: its heads were trained for these settings
        wrong = {k: settings[k] for k in ("head", "action_bins", "instruction") if getattr(options, k) != settings[k]}
        if wrong:
            raise ValueError(
                f"path: {folder} was exported with {', '.join(f'{k}: {v!r}' for k, v in wrong.items())}; set the"
                " same (its heads were trained for them)"
            )
    if options.head != "tokens":
        return
    vocab = written.get("text_config", {}).get("vocab_size")  # absent: its class's default, which transformers knows
    vocab = (loaded or _loaded_config(options)).text_config.vocab_size if remote or vocab is None else vocab
    if options.action_bins >= vocab // 2:
        raise ValueError(
            f"action_bins: {options.action_bins} bins need a vocabulary of more than {2 * options.action_bins}"
            f" tokens (the last ones become bins); this model has {vocab}"
        )


def read_config(folder: str | Path) -> dict[str, Any]:
    """The folder's config.json as written (sizes its class leaves to defaults are absent); a ValueError naming
    the file where it is not JSON."""
    path = Path(folder) / "config.json"
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from None


def exported_settings(options: HFOptions) -> dict[str, Any] | None:
    """The heads' settings `m2flow export` wrote beside the backbone, or None for a folder it did not write."""
    exported = Path(options.path) / HEADS_FILE
    return json.loads(exported.read_text()) if exported.exists() else None


def check_exported_actions(options: HFOptions, act_dim: int) -> None:
    """An exported policy's heads emit the actions they were trained for: ValueError if this policy's
    (the env's action size x chunk) differ."""
    trained = (exported_settings(options) or {}).get("act_dim")
    if trained is not None and trained != act_dim:
        raise ValueError(
            f"hf.path: {options.path} was exported for {trained} action values per call; this policy emits"
            f" {act_dim} (the env's action size x chunk): use the env and chunk it was trained with"
        )


def prompt(image_token: str, instruction: str) -> str:
    """The policy's prompt: the image, then the task's instruction."""
    return f"{image_token} {instruction}".strip()
