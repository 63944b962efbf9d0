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

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Categorical

import m2flow
from m2flow.workers.models.hf_options import HEADS_FILE, HEADS_WEIGHTS, HFOptions, prompt, transformers
from m2flow.workers.models.inputs import VisionInputs
from m2flow.workers.models.vision import VisionActorCritic, image_planes


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
