"""Soft actor-critic training worker (Haarnoja et al. 2018): twin Q-networks with Polyak-averaged targets,
a tanh-squashed Gaussian policy, the entropy temperature tuned to a target entropy — CleanRL's
`sac_continuous_action.py` update, fed by a replay buffer worker (`m2flow.workers.buffer.ReplayBuffer`).

`train(minibatches)` runs one gradient step per minibatch the buffer sampled this iteration (none while the
buffer fills); `weights()` is the policy for the inference worker (`TorchPolicy` with `model: squashed`);
`priorities()` the new priorities (|TD error|) of the transitions it trained on, for prioritised replay.
One rank: SAC's networks are small and its updates sequential.
"""

from __future__ import annotations

import copy
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import Field, model_validator

import m2flow
from m2flow.durable import write_durably
from m2flow.errors import WorkerError
from m2flow.workers.models import PolicyArgs

if TYPE_CHECKING:
    import torch


class SACConfig(PolicyArgs):
    """CleanRL's `sac_continuous_action.py` arguments (its defaults); the policy is `model: squashed`."""

    model: str = Field("squashed", description="SAC's policy: the tanh-squashed Gaussian (model: squashed)")
    hidden: list[int] = Field(
        default_factory=lambda: [256, 256], min_length=1, description="the actor's and both critics' hidden widths"
    )
    gamma: float = Field(0.99, ge=0, le=1, description="discount factor")
    tau: float = Field(0.005, gt=0, le=1, description="Polyak step of the target Q-networks")
    policy_lr: float = Field(3e-4, gt=0, description="Adam's learning rate for the policy")
    q_lr: float = Field(1e-3, gt=0, description="Adam's learning rate for the Q-networks")
    policy_frequency: int = Field(2, ge=1, description="Q-updates per policy update (TD3's delay, as CleanRL)")
    target_network_frequency: int = Field(1, ge=1, description="Q-updates per target update")
    alpha: float = Field(0.2, gt=0, description="the entropy temperature without autotune (tuned: it starts at 1)")
    autotune: bool = Field(True, description="tune the temperature towards an entropy of -action size")

    @model_validator(mode="after")
    def _squashed_only(self) -> SACConfig:
        if self.model != "squashed":
            raise ValueError(f"SAC's policy is model: squashed, not '{self.model}'")
        return self


class SAC:
    Config = SACConfig

    @staticmethod
    def data_parallel_size(cfg: SACConfig, replicas: int, backend: str | None) -> int:
        """One rank: SAC's update runs whole in one process (more are refused as the workflow is validated)."""
        if replicas > 1:
            raise ValueError(f"replicas: SAC trains on one rank, not {replicas}; set it to 1")
        return 1

    def __init__(self, **args: Any):
        import torch

        from m2flow.workers.models.policy import observation_encoder
        from m2flow.workers.models.twin_q import TwinQ

        ctx = m2flow.context()
        self.cfg = cfg = SACConfig(**args)
        torch.manual_seed(ctx.seed)
        self.device = torch.device(ctx.device)
        self.actor = cfg.build().to(self.device)
        act_dim = self.actor.act_dim
        self.critic = TwinQ(observation_encoder(cfg), act_dim, cfg.hidden).to(self.device)
        self.critic_target = copy.deepcopy(self.critic)
        self.actor.encoder, self.actor.detach_encoder = self.critic.encoder, True  # DrQ: one encoder, the critic's
        shared = {id(p) for p in self.critic.encoder.parameters()}
        policy = [p for p in self.actor.parameters() if id(p) not in shared]
        self.q_optimizer = torch.optim.Adam(self.critic.parameters(), lr=cfg.q_lr)
        self.actor_optimizer = torch.optim.Adam(policy, lr=cfg.policy_lr)
        self.target_entropy = -float(act_dim)
        start = 1.0 if cfg.autotune else cfg.alpha  # CleanRL: log alpha 0 when tuned
        self.log_alpha = torch.tensor(np.log(start), dtype=torch.float32, device=self.device, requires_grad=True)
        self.alpha_optimizer = torch.optim.Adam([self.log_alpha], lr=cfg.q_lr)
        self.version = 0
        self.updates = 0
        self._priorities: dict[str, np.ndarray] = {}

    def weights(self) -> dict[str, Any]:
        from m2flow.workers.models.checksum import state_checksum

        state = {k: v.detach().clone() for k, v in self.actor.state_dict().items()}
        return {"version": self.version, "state": state, "checksum": state_checksum(state), "scope": "all"}

    def train(self, minibatches: list[dict[str, np.ndarray]]) -> dict[str, float]:
        """One gradient step per minibatch: `minibatches` holds each buffer replica's [updates, batch, ...],
        its shard's share of every minibatch (side by side, they make the minibatch)."""
        import torch

        self._priorities = {}
        sampled = [len(m["reward"]) for m in minibatches]
        if len(set(sampled)) > 1:
            raise WorkerError(
                f"SAC.train: the replay buffer's shards sampled {sampled} minibatches: they received unequal env"
                " steps; give each buffer replica the same number of simulator replicas"
            )
        batch = _side_by_side(minibatches)
        if "weight" in batch and batch["weight"].size:  # prioritised replay: normalised over the whole sample
            batch["weight"] = batch["weight"] / batch["weight"].max()
        updates = len(batch["reward"])
        if not updates:
            return {"actor/updates": 0.0}
        sums: dict[str, torch.Tensor] = {}
        counts: dict[str, int] = {}  # the policy's statistics come from every policy_frequency-th update
        td_errors = []
        for u in range(updates):
            stats, td = self._update(self._minibatch(batch, u))
            td_errors.append(td)
            for key, value in stats.items():
                sums[key] = sums.get(key, 0.0) + value
                counts[key] = counts.get(key, 0) + 1
        metrics = {f"actor/{k}": float(v) / counts[k] for k, v in sums.items()}
        if not all(np.isfinite(list(metrics.values()))):
            raise WorkerError(f"SAC.train: the update went non-finite ({metrics}); lower the learning rates")
        self._priorities = {"index": batch["index"], "priority": torch.stack(td_errors).cpu().numpy()}
        self.version += 1
        metrics.update({"actor/updates": float(updates), "actor/weights_version": float(self.version)})
        return metrics

    def priorities(self) -> dict[str, np.ndarray]:
        """|TD error| of each transition the last `train` sampled, for `ReplayBuffer.update_priorities`."""
        return self._priorities

    def _minibatch(self, batch: dict[str, Any], update: int) -> dict[str, Any]:
        """Update `update`'s minibatch on the device; observations as the encoders read them."""
        import torch

        mb: dict[str, Any] = {}
        for key, value in batch.items():
            if key in ("obs", "next_obs"):
                mb[key] = self.actor.inputs(_row(value, update), self.device)
            elif key != "index":
                mb[key] = torch.as_tensor(value[update], device=self.device)
        return mb

    def _update(self, mb: dict[str, Any]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        import torch

        cfg = self.cfg
        alpha = self.log_alpha.exp().detach()
        with torch.no_grad():
            next_action, next_logprob = self.actor.sample(mb["next_obs"])
            next_q = torch.min(*self.critic_target(mb["next_obs"], next_action))
            target = mb["reward"] + cfg.gamma * (1 - mb["terminal"]) * (next_q - alpha * next_logprob)
        q1, q2 = self.critic(mb["obs"], mb["action"])
        weight = mb.get("weight")  # prioritised replay's importance weights
        errors = (q1 - target).square() + (q2 - target).square()
        q_loss = (errors * weight).mean() if weight is not None else errors.mean()
        self.q_optimizer.zero_grad()
        q_loss.backward()
        self.q_optimizer.step()
        stats = {"q_loss": q_loss.detach() / 2, "q_value": q1.detach().mean(), "alpha": alpha}
        if self.updates % cfg.policy_frequency == 0:
            for _ in range(cfg.policy_frequency):  # CleanRL: the delayed updates, made up at once
                action, logprob = self.actor.sample(mb["obs"])
                q = torch.min(*self.critic(mb["obs"], action, detach_encoder=True))  # the policy loss trains no CNN
                policy_loss = (alpha * logprob - q).mean()
                self.actor_optimizer.zero_grad()
                policy_loss.backward()
                self.actor_optimizer.step()
                if cfg.autotune:  # on the log-probs of the policy just stepped, as CleanRL
                    with torch.no_grad():
                        _, logprob = self.actor.sample(mb["obs"])
                    alpha_loss = (-self.log_alpha.exp() * (logprob + self.target_entropy)).mean()
                    self.alpha_optimizer.zero_grad()
                    alpha_loss.backward()
                    self.alpha_optimizer.step()
                    alpha = self.log_alpha.exp().detach()
            stats.update(policy_loss=policy_loss.detach(), entropy=-logprob.detach().mean())
        if self.updates % cfg.target_network_frequency == 0:
            with torch.no_grad():
                for p, tp in zip(self.critic.parameters(), self.critic_target.parameters(), strict=True):
                    tp.lerp_(p, cfg.tau)
        self.updates += 1
        return stats, (q1 - target).detach().abs()

    def _modules(self) -> dict[str, Any]:
        return {
            "actor": self.actor,
            "critic": self.critic,
            "critic_target": self.critic_target,
            "q_optimizer": self.q_optimizer,
            "actor_optimizer": self.actor_optimizer,
            "alpha_optimizer": self.alpha_optimizer,
        }

    def save_checkpoint(self, path: str) -> None:
        import torch

        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        state = {name: module.state_dict() for name, module in self._modules().items()}
        state.update(
            log_alpha=self.log_alpha.detach().cpu(),
            version=self.version,
            updates=self.updates,
            rng=torch.get_rng_state(),
            cuda_rng=torch.cuda.get_rng_state() if self.device.type == "cuda" else None,
        )
        write_durably(root / "sac.pt", partial(torch.save, state))

    def load_checkpoint(self, path: str) -> None:
        import torch

        state = torch.load(Path(path) / "sac.pt", map_location=self.device, weights_only=False)
        for name, module in self._modules().items():
            module.load_state_dict(state[name])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.version, self.updates = int(state["version"]), int(state["updates"])
        torch.set_rng_state(state["rng"].cpu())
        if state["cuda_rng"] is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"].cpu())


def _row(value: Any, update: int) -> Any:
    """Row `update` of [updates, batch, ...] arrays (an observation may be a dict of them)."""
    return {key: v[update] for key, v in value.items()} if isinstance(value, dict) else value[update]


def _side_by_side(shares: list[dict[str, Any]]) -> dict[str, Any]:
    """The buffer shards' shares of each minibatch joined along the batch axis (axis 1 of [updates, batch,
    ...]), field by field (an observation may be a dict of modalities)."""
    joined: dict[str, Any] = {}
    for key, value in shares[0].items():
        parts = [share[key] for share in shares]
        joined[key] = _side_by_side(parts) if isinstance(value, dict) else np.concatenate(parts, axis=1)
    return joined
