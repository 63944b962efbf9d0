"""Hugging Face vision-language models as policies (`model: hf`), loaded from a local folder.

The backbone is a transformers image-text-to-text model (LLaVA-style: a vision tower, a projector, a
decoder LM), loaded with its processor from `path` — never from a hub — through accelerate's big-model
loading (`device_map`: the weights land on their device once, not materialised twice on the host); on the
meta device it is built from its config alone (the planner's memory estimate). The instruction prompt is
tokenised once; each observation's camera image is normalised as the processor would and fed with it.

Two action heads, both stochastic so that PPO/GRPO can train them:
- `gaussian` (OpenVLA-OFT / pi0 style): the last prompt token's hidden state -> the mean of a Gaussian with
  a learnable log-std, over `act_dim x chunk` continuous actions;
- `tokens` (OpenVLA style): the last `action_bins` vocabulary tokens are bins of [-1, 1]; one placeholder
  position per action dimension after the prompt, decoded in parallel (as OpenVLA-OFT does): the action's
  log-prob and entropy are sums over the dimensions' categorical distributions restricted to the bins.
A value head on the same hidden state serves PPO. Optional LoRA (peft) on the decoder's projections.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from torch import nn
from torch.distributions import Categorical

import m2flow
from m2flow.errors import MissingDependency
from m2flow.workers.models.activations import Stack
from m2flow.workers.models.precision import Precision
from m2flow.workers.models.vision import VisionActorCritic, VisionInputs, image_planes

HEADS_FILE = "m2flow_policy.json"  # what `m2flow export` adds beside the backbone: the heads' settings...
HEADS_WEIGHTS = "m2flow_heads.safetensors"  # ...and their weights


class LoraOptions(BaseModel):
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


class HFOptions(BaseModel):
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
    AutoConfig = transformers().AutoConfig  # noqa: N806 - the class, as transformers names it

    folder = Path(options.path)
    if not folder.is_dir():
        raise ValueError(f"path: no folder {folder}; point it at a local transformers checkpoint (no hub is used)")
    if not (folder / "config.json").exists():
        raise ValueError(
            f"path: {folder} has no config.json: not a transformers checkpoint (save_pretrained writes one)"
        )
    if "auto_map" in json.loads((folder / "config.json").read_text()) and not options.trust_remote_code:
        raise ValueError(
            f"path: {folder} brings its own model code (config.json's auto_map); set trust_remote_code: true to"
            " run it, only for a folder you trust"
        )
    config = AutoConfig.from_pretrained(folder, trust_remote_code=options.trust_remote_code)
    if not isinstance(config, transformers().LlavaConfig):
        raise ValueError(
            f"path: {folder} holds a {config.model_type!r} model; m2flow's hf policies take LLaVA models"
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
    vocab = config.text_config.vocab_size
    if options.head == "tokens" and options.action_bins >= vocab // 2:
        raise ValueError(
            f"action_bins: {options.action_bins} bins need a vocabulary of more than {2 * options.action_bins}"
            f" tokens (the last ones become bins); this model has {vocab}"
        )


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


def hf_stacks(options: HFOptions, act_dim: int) -> list[Stack]:
    """The vision tower's and the decoder's layers over one sample's tokens, from the folder's config and
    tokenizer: the image's patches (+ a class token in the tower); in the decoder the prompt as the policy
    builds it, the image's tokens in place of its placeholder, and the tokens head's action positions."""
    lib = transformers()
    remote = options.trust_remote_code
    config = lib.AutoConfig.from_pretrained(options.path, trust_remote_code=remote)
    tokenizer = lib.AutoTokenizer.from_pretrained(options.path, trust_remote_code=remote)
    vision, text = config.vision_config, config.text_config
    patches = (vision.image_size // vision.patch_size) ** 2
    image_tokens = patches + (getattr(config, "vision_feature_select_strategy", "default") == "full")
    placeholder = tokenizer.convert_ids_to_tokens(config.image_token_index)
    ids = tokenizer(prompt(placeholder, options.instruction))["input_ids"]
    actions = act_dim if options.head == "tokens" else 0
    decoder_tokens = len(ids) - ids.count(config.image_token_index) + image_tokens + actions
    heads = text.num_attention_heads
    kv = getattr(text, "num_key_value_heads", None) or heads
    return [
        Stack(vision.num_hidden_layers, patches + 1, vision.hidden_size, vision.intermediate_size, vision.hidden_size),
        Stack(
            text.num_hidden_layers,
            decoder_tokens,
            text.hidden_size,
            text.intermediate_size,
            text.hidden_size * kv // heads,
            style="llama" if getattr(text, "hidden_act", "") == "silu" else "vit",  # SwiGLU decoders: LLaMA-style
        ),
    ]


def prompt(image_token: str, instruction: str) -> str:
    """The policy's prompt: the image, then the task's instruction."""
    return f"{image_token} {instruction}".strip()


class HFPolicy(VisionActorCritic):
    """A policy over a Hugging Face VLM; reads the first camera's RGB (and proprioception, if any)."""

    def __init__(self, inputs: VisionInputs, options: HFOptions):
        super().__init__(inputs)
        self.options = options
        loaded = _load(options)
        self.backbone, self.template = loaded.backbone, loaded.template
        self._blocks = _layers(self.backbone)  # not registered twice: the backbone holds them
        self._checkpointing = False
        text = self._model().config.text_config
        width = text.hidden_size + inputs.proprio_dim
        self.critic = nn.Linear(width, 1)
        if options.head == "gaussian":
            self.actor_mean = nn.Linear(width, inputs.act_dim)
            nn.init.orthogonal_(self.actor_mean.weight, 0.01)
            nn.init.zeros_(self.actor_mean.bias)
            self.actor_logstd = nn.Parameter(torch.full((1, inputs.act_dim), -0.5))
        self.bin_tokens = text.vocab_size - options.action_bins  # the first bin's token id
        self.register_buffer("bins", torch.linspace(-1.0, 1.0, options.action_bins), persistent=False)
        self.register_buffer("pixel_mean", torch.tensor(loaded.mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("pixel_std", torch.tensor(loaded.std).view(1, 3, 1, 1), persistent=False)
        heads = Path(options.path) / HEADS_WEIGHTS
        if heads.exists():  # a policy `m2flow export` wrote: its trained heads come with it
            from safetensors.torch import load_file

            self.load_state_dict(load_file(heads), strict=False)
        _without_dropout(self.backbone)
        self.train()  # from_pretrained hands the backbone over in eval mode, where no layer recomputes

    @property
    def blocks(self) -> list[nn.Module]:
        """The transformer blocks FSDP2 shards one by one: the vision tower's and the decoder's layers."""
        return self._blocks

    @property
    def activation_checkpointing(self) -> bool:
        """Whether each vision and decoder layer recomputes its activations in backward (the backend sets it)."""
        return self._checkpointing

    @activation_checkpointing.setter
    def activation_checkpointing(self, on: bool) -> None:
        model = self._model()
        if on and not self._checkpointing:  # non-reentrant: gradients reach layers whose inputs need none (LoRA)
            # transformers renamed it in 5.x; the older name still works there with a warning
            enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
            enable({"use_reentrant": False})
        elif not on and self._checkpointing:
            disable = getattr(model, "activation_checkpointing_disable", None) or model.gradient_checkpointing_disable
            disable()
        self._checkpointing = on

    def _model(self) -> nn.Module:
        """The transformers model (under peft's wrapper when LoRA is on)."""
        return self.backbone.get_base_model() if hasattr(self.backbone, "get_base_model") else self.backbone

    def prompt_inputs(self, obs: dict[str, torch.Tensor], extra: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """The backbone's inputs: the prompt's token ids (+ `extra` placeholder positions), and the first
        camera's image normalised as the processor would, in the backbone's dtype."""
        pixels = (image_planes({"rgb": obs["rgb"][:, :1]}) - self.pixel_mean) / self.pixel_std
        n = pixels.shape[0]
        ids = self.template.to(pixels.device).expand(n, -1)
        if extra:
            ids = torch.cat([ids, torch.full((n, extra), self.bin_tokens, dtype=ids.dtype, device=ids.device)], 1)
        return ids, pixels.to(next(self.backbone.parameters()).dtype)

    def _decode(self, obs: dict[str, torch.Tensor], extra: int = 0) -> torch.Tensor:
        """The decoder's last hidden state at every position: [n, tokens, width] (the other layers' are not
        kept, nor logits over the whole vocabulary)."""
        ids, pixels = self.prompt_inputs(obs, extra)
        return self._model().base_model(input_ids=ids, pixel_values=pixels, use_cache=False).last_hidden_state

    def bin_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The action bins' logits at the last `act_dim` positions: [n, act_dim, bins] (fp32), from only the
        bins' rows of the output embedding."""
        head = self._model().get_output_embeddings()
        bias = None if head.bias is None else head.bias[self.bin_tokens :]
        return F.linear(hidden[:, -self.act_dim :], head.weight[self.bin_tokens :], bias).float()

    def _features(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self._with_proprio(self._decode(obs)[:, -1], obs)

    def _with_proprio(self, features: torch.Tensor, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The heads' input in the heads' dtype: fp32, or bf16 while FSDP2 computes in bf16."""
        dtype = self.critic.weight.dtype
        features = features.to(dtype)
        return torch.cat([features, obs["proprio"].to(dtype)], -1) if "proprio" in obs else features

    def forward(self, obs, action=None, noise=None, value_only=False):
        if self.options.head == "gaussian":
            return super().forward(obs, action, noise, value_only)
        hidden = self._decode(obs, extra=self.act_dim)
        value = self.critic(self._with_proprio(hidden[:, -self.act_dim - 1], obs)).squeeze(-1).float().clone()
        if value_only:
            return value
        dist = Categorical(logits=self.bin_logits(hidden))  # [n, act_dim, bins]
        if action is None:
            index = dist.sample() if noise is None else _inverse_cdf(dist.probs, noise)
            action = self.bins[index]
        index = torch.bucketize(action.clamp(-1, 1), (self.bins[1:] + self.bins[:-1]) / 2)
        return action, dist.log_prob(index).sum(-1), dist.entropy().sum(-1), value

    def mean_action(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The deterministic action: the Gaussian's mean, or each dimension's most likely bin."""
        if self.options.head == "gaussian":
            return super().mean_action(obs)
        return self.bins[self.bin_logits(self._decode(obs, extra=self.act_dim)).argmax(-1)]

    def trainable_keys(self) -> set[str]:
        """The state names training changes: everything, or with LoRA the adapters and the heads."""
        return {name for name, p in self.named_parameters() if p.requires_grad}

    def export(self, folder: str | Path) -> Path:
        """A transformers checkpoint of the trained policy (LoRA merged), its processor, and the heads with
        their settings; `model: hf, path: <folder>` loads it again."""
        from safetensors.torch import save_file
        from transformers import AutoProcessor

        folder = Path(folder)
        backbone = self.backbone.merge_and_unload() if hasattr(self.backbone, "merge_and_unload") else self.backbone
        backbone.save_pretrained(folder)
        AutoProcessor.from_pretrained(self.options.path).save_pretrained(folder)
        heads = {
            k: v.detach().cpu().contiguous() for k, v in self.state_dict().items() if not k.startswith("backbone.")
        }
        save_file(heads, folder / HEADS_WEIGHTS)
        settings = self.options.model_dump(exclude={"path", "lora"}) | {"act_dim": self.act_dim}
        (folder / HEADS_FILE).write_text(json.dumps(settings, indent=1))
        return folder


def _inverse_cdf(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """A draw per dimension from standard-normal `noise` (an env's own stream, so actions do not depend on how
    envs are batched): the bin where the cumulative probability passes the noise's quantile."""
    uniform = torch.special.ndtr(noise.float())[..., None]  # [n, act_dim, 1]
    return (probs.cumsum(-1) < uniform).sum(-1).clamp(max=probs.shape[-1] - 1)


@dataclass
class _Loaded:
    backbone: nn.Module
    template: torch.Tensor  # the prompt's token ids, image placeholders expanded: [1, tokens]
    mean: list[float]  # the image processor's normalisation
    std: list[float]


def _load(options: HFOptions) -> _Loaded:
    """The backbone (from the folder's weights, or — on the meta device — from its config alone, allocating
    nothing), with LoRA if asked, and the prompt tokenised by the folder's processor."""
    transformers().utils.logging.disable_progress_bar()
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

    folder = Path(options.path)
    dtype = torch.bfloat16 if options.dtype == "bf16" else torch.float32
    remote = options.trust_remote_code
    if torch.get_default_device().type == "meta":
        config = AutoConfig.from_pretrained(folder, trust_remote_code=remote)
        backbone = AutoModelForImageTextToText.from_config(config, dtype=dtype, trust_remote_code=remote)
    else:  # straight onto the worker's device, once (the heads are built on the host, then moved with the rest)
        device = torch.device(m2flow.context().device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        backbone = AutoModelForImageTextToText.from_pretrained(
            folder, dtype=dtype, device_map={"": str(device)}, trust_remote_code=remote
        )
    if options.lora is not None:
        from peft import LoraConfig, get_peft_model

        lora = options.lora
        adapters = LoraConfig(r=lora.r, lora_alpha=lora.alpha, target_modules=lora.target_modules)
        backbone = get_peft_model(backbone, adapters)
    processor = AutoProcessor.from_pretrained(folder, trust_remote_code=remote)
    images = processor.image_processor
    size = images.crop_size or images.size
    dummy = np.zeros((size["height"], size["width"], 3), np.uint8)
    text = prompt(getattr(processor, "image_token", "<image>"), options.instruction)
    with torch.device("cpu"):  # token ids, also when the model is built on the meta device
        template = processor(text=text, images=dummy, return_tensors="pt")["input_ids"]
    return _Loaded(backbone, template, list(images.image_mean), list(images.image_std))


def _without_dropout(backbone: nn.Module) -> None:
    """No dropout anywhere (modules, and the attention's functional rate): the policy is the same function
    when it acts (eval mode) and when PPO rates its actions (train mode)."""
    for module in backbone.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd):
            module.p = 0.0
        for name, value in list(vars(module).items()):  # rates the forward reads as numbers (attention_dropout)
            if isinstance(value, float) and ("dropout" in name or "pdrop" in name):
                setattr(module, name, 0.0)


def _layers(backbone: nn.Module) -> list[nn.Module]:
    blocks = []
    for name, module in backbone.named_modules():
        if name.endswith((".layers", ".layer")) and isinstance(module, nn.ModuleList):
            blocks += list(module)
    return blocks
