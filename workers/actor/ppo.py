"""PPO training worker: GAE, clipped ratio, value clipping, entropy bonus, advantage normalisation,
minibatch epochs — CleanRL's ppo_continuous_action.py update, on a data-parallel group of ranks.

Each rank receives its data-parallel share of the batch (whole simulator shards). Every rank draws the
same permutation of the whole batch; each computes the loss on the samples of every minibatch that it
holds (advantages normalised over the whole minibatch), weighted so that the gradient the backend
averages equals the one-rank gradient.

Where it is not CleanRL 1.2.0's update: an episode a time limit cuts (not the task) goes on in its return
from the value of its final observation, as Stable-Baselines3 bootstraps it (CleanRL ends the return there);
observations are normalised by the simulator (`GymEnv`), so the batch arrives normalised.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

import m2flow
from m2flow.errors import WorkerError
from m2flow.workers.actor import ppo_checkpoint
from m2flow.workers.actor.backends import BackendOptions, backend_class, get_backend
from m2flow.workers.actor.ppo_batch import (
    ADVANTAGES,
    TIME_MAJOR,
    AdvantageInputs,
    Bootstrap,
    Part,
    cat,
    flatten,
    time_major,
)
from m2flow.workers.actor.ppo_config import PPOConfig
from m2flow.workers.models import state_size
from m2flow.workers.models.activations import activation_bytes

if TYPE_CHECKING:
    import torch

    from m2flow.workers.algorithms import ReturnScaler


class PPO:
    Config = PPOConfig

    def __init__(self, **args: Any):
        import torch

        from m2flow.workers.algorithms import PPOLossConfig

        ctx = m2flow.context()
        self.cfg = PPOConfig(**args)
        vf_coef = 0.0 if self.cfg.advantage == "grpo" else self.cfg.vf_coef
        self.loss_cfg = PPOLossConfig(
            self.cfg.clip_coef, self.cfg.clip_vloss, self.cfg.ent_coef, vf_coef, self.cfg.norm_adv
        )
        torch.manual_seed(ctx.seed)
        self.device = torch.device(ctx.device)
        self.backend = get_backend(ctx, BackendOptions(**self.cfg.model_dump(include=set(BackendOptions.model_fields))))
        self.model = self.backend.wrap(self.cfg.build().to(self.device))
        # fused: one kernel per step for every tensor (the update's Adam steps ran 3x faster on CPU here)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=self.cfg.learning_rate, eps=1e-5, fused=True)
        self.generator = torch.Generator().manual_seed(ctx.seed + 7)
        self.iterations = ctx.iterations  # the learning rate anneals to 0 over these
        self.scaler: ReturnScaler | None = None
        self.version = 0
        self.updates = 0
        self._parts: list[Part] = []  # parts of this iteration's batch that arrived early

    @staticmethod
    def memory_estimate_gb(cfg: PPOConfig, samples: int) -> float:
        """A rank's device memory: its state for training and a minibatch's activations (`_memory_parts`)."""
        state, activations = _memory_parts(cfg, samples)
        return (state + activations) / 2**30

    @staticmethod
    def memory_advice(cfg: PPOConfig, samples: int) -> str:
        """What lowers a rank's memory, by its larger part: the activations a minibatch keeps, or the state."""
        state, activations = _memory_parts(cfg, samples)
        if activations >= state:
            minibatch = cfg.minibatch_of(max(1, samples))
            smaller = (
                f"lower args.minibatch_size (now {cfg.minibatch_size})"
                if cfg.minibatch_size
                else f"raise args.num_minibatches (now {cfg.num_minibatches})"
            )
            checkpointing = "" if cfg.activation_checkpointing else " or set args.activation_checkpointing: true"
            kept = f"a minibatch of {minibatch} samples keeps {activations / 2**30:.3g} GB for backward"
            return f"{kept}: {smaller}{checkpointing}"
        offload = "" if cfg.cpu_offload else "set args.cpu_offload: true (CUDA: the state on the host between uses) or "
        return f"the model's state for training takes {state / 2**30:.3g} GB: {offload}train a smaller model"

    @staticmethod
    def data_parallel_size(cfg: PPOConfig, replicas: int, backend: str | None) -> int:
        """Ranks holding distinct data: all of them under FSDP, one group under Megatron's tensor parallelism."""
        try:
            return backend_class(backend).data_parallel_size(replicas)
        except ValueError as exc:
            raise ValueError(f"backend: {exc}") from None

    def weights(self) -> dict[str, Any]:
        """The policy state for inference workers, versioned and checksummed (a collective on every rank): all
        of it, or — when parts are frozen (LoRA) — only what training changes (`scope: trainable`)."""
        from m2flow.workers.models.checksum import state_checksum

        state = self.backend.full_state_dict(self.model)
        frozen = {name for name, p in self.model.named_parameters() if not p.requires_grad}
        scope = "trainable" if frozen else "all"
        state = {k: v for k, v in state.items() if k not in frozen}
        return {"version": self.version, "state": state, "checksum": state_checksum(state), "scope": scope}

    def train_part(self, trajectories: list[dict[str, Any]]) -> None:
        """Parts of the batch that are ready (one loop replica's slices), sent while other replicas still
        step: moved to the device now. Nothing here runs the model: a sharded model's forward is a
        collective, and the ranks' parts arrive at different times — or, where a loop replica is replaced
        and its part redone, on one rank and not yet on another. The update itself, and the bootstrap
        values, wait for `train`, where every rank runs them together."""
        self._parts += [self._prepare(t) for t in trajectories]

    def _prepare(self, trajectory: dict[str, Any]) -> Part:
        """One part as tensors on the device, time-major [T, envs, ...] (arrays from Ray's object store are
        read-only: copied where torch needs it), with the observations its bootstrap values are of (GAE)."""
        import torch

        steps, envs = np.shape(trajectory["reward"])
        obs = time_major(self.model.inputs(flatten(trajectory["obs"]), self.device), steps, envs)
        tensors = {"obs": obs, "next_done": torch.tensor(trajectory["next_done"], device=self.device)}
        arrays = [key for key in TIME_MAJOR if key != "obs" and key in trajectory]
        tensors.update({key: torch.tensor(trajectory[key], device=self.device) for key in arrays})
        if "env_ids" in trajectory:
            tensors["env_ids"] = torch.tensor(trajectory["env_ids"], dtype=torch.long, device=self.device)
        gae = self.cfg.advantage == "gae"
        return Part(tensors, Bootstrap.of(self.model, trajectory, self.device) if gae else None)

    def _with_values(self, part: Part) -> dict[str, Any]:
        """A part's tensors with its bootstrap values (GAE): of its last observation, and of the final
        observations of the episodes a time limit cut short (0 elsewhere): one or two forwards, only those
        rows through the model and at least one (row 0, its value unused): a sharded model's forward is a
        collective (every rank runs as many: `_match_forwards`), and image models cannot reshape an empty
        batch."""
        import torch

        tensors, bootstrap = dict(part.tensors), part.bootstrap
        if bootstrap is None:
            return tensors
        steps, envs = tensors["reward"].shape
        with torch.no_grad(), self.backend.compute():
            tensors["next_value"] = self.model.get_value(bootstrap.next_obs).float()
            if bootstrap.final_obs is not None:
                computed = self.model.get_value(bootstrap.final_obs).float()
                values = torch.zeros(steps * envs, device=self.device)
                values[torch.as_tensor(bootstrap.cut, device=self.device)] = computed[: len(bootstrap.cut)]
                tensors["final_value"] = values.reshape(steps, envs)
        return tensors

    def _match_forwards(self, prepared: list[Part]) -> None:
        """As many bootstrap forwards on this rank as on the rank with the most parts (simulator replicas
        need not split evenly over the ranks; a forward is a collective under FSDP): the missing ones run on
        this rank's first part, their values dropped."""
        import torch

        if self.backend.data_world == 1 or not prepared or prepared[0].bootstrap is None:
            return
        most = int(self.backend.gather_data_ranks(torch.tensor(len(prepared), device=self.device)).max())
        for _ in range(most - len(prepared)):
            self._with_values(prepared[0])

    def train(self, trajectories: list[dict[str, Any]]) -> dict[str, float]:
        """One PPO update on this rank's data-parallel share of the batch (its producers' trajectories).

        The minibatches are CleanRL's: a permutation of the whole batch, the same on every rank; each rank
        computes the loss on the samples of each minibatch that it holds, weighted so that the gradient the
        backend averages over ranks is the one-rank gradient of the whole minibatch."""
        import torch

        from m2flow.workers.actor.samples import Samples
        from m2flow.workers.algorithms import ReturnScaler, ppo_loss
        from m2flow.workers.algorithms.moments import across_ranks

        cfg = self.cfg
        streamed = len(self._parts) == len(trajectories)  # every part arrived early (a streamed then-edge)
        prepared = self._parts if streamed else [self._prepare(t) for t in trajectories]
        parts, self._parts = [self._with_values(p) for p in prepared], []
        self._match_forwards(prepared)
        batch = {key: cat([part[key] for part in parts], dim=1 if key in TIME_MAJOR else 0) for key in parts[0]}
        rewards, dones, values = batch["reward"], batch["done"], batch["value"]
        steps, envs = rewards.shape
        staleness = self._staleness(batch)
        proximal = None  # log-probs under the weights this update starts from, for samples older ones acted on
        if staleness and staleness["actor/staleness_max"] > 0:  # the critic's values are the update's own too
            values, current = self._proximal(batch)
            proximal = current if cfg.off_policy == "decoupled" else None
        env_ids = self._env_ids = self._global_env_ids(batch, envs)
        total_envs = int(self.backend.sum_data_ranks(torch.tensor(envs)))
        combine = across_ranks(self.backend.gather_data_ranks) if self.backend.data_world > 1 else None
        rewards_mean = float(rewards.mean())
        if cfg.normalize_reward:
            if self.scaler is None:
                self.scaler = ReturnScaler(total_envs, cfg.gamma)
            rewards = self.scaler(rewards.cpu(), dones.cpu(), env_ids.cpu(), combine).to(self.device)
        if "final_value" in batch:  # a time limit cut these episodes: their return goes on (SB3's bootstrap)
            rewards = rewards + cfg.gamma * batch["final_value"] * batch["truncated"]
        inputs = AdvantageInputs(rewards, values, dones, batch.get("next_value"), batch["next_done"], env_ids)
        advantages, returns = ADVANTAGES[cfg.advantage](cfg, inputs)
        b_obs = flatten(batch["obs"])
        b_actions = batch["action"].reshape(steps * envs, -1)
        b_logprobs = (proximal if proximal is not None else batch["logprob"]).reshape(-1)
        behavior_weights = None
        if proximal is not None:
            behavior_weights = (proximal - batch["logprob"]).exp().clamp(max=cfg.behavior_weight_cap).reshape(-1)
        b_values = values.reshape(-1)
        b_advantages, b_returns = advantages.reshape(-1), returns.reshape(-1)

        if cfg.anneal_lr:  # CleanRL: frac = 1 - (update - 1) / num_updates
            frac = max(0.0, 1.0 - self.updates / self.iterations)
            self.optimizer.param_groups[0]["lr"] = frac * cfg.learning_rate
        # sample (t, env) of the whole batch is t * total_envs + env id; `local_of` maps it to this rank's row
        batch_size = steps * total_envs
        local_of = torch.full((batch_size,), -1, dtype=torch.long, device=self.device)
        mine = (torch.arange(steps, device=self.device)[:, None] * total_envs + env_ids[None, :]).reshape(-1)
        local_of[mine] = torch.arange(steps * envs, device=self.device)
        minibatch_size = cfg.minibatch_of(batch_size)
        samples = Samples(b_obs, b_actions, b_logprobs, b_values, b_advantages, b_returns, behavior_weights)
        sums: torch.Tensor | None = None  # per-minibatch statistics, summed on the device (no sync per step)
        grad_norms: torch.Tensor | None = None  # on the norm's device (the host under CPU offload)
        count = 0
        for _ in range(cfg.update_epochs):
            order = torch.randperm(batch_size, generator=self.generator).to(self.device)
            shuffled, bounds = samples.in_minibatches(local_of[order], minibatch_size)
            for start, end, size in bounds:  # the last minibatch may be smaller, as in CleanRL
                mb = shuffled.rows(start, end)
                mb_advantages = self._normalize(mb.advantages) if cfg.norm_adv else mb.advantages
                # this rank's share of the minibatch mean; a rank holding none of it still joins the collectives
                weight = (end - start) * self.backend.data_world / size
                if start == end:
                    mb, mb_advantages = shuffled.rows(0, 1), mb_advantages.new_zeros(1)
                with self.backend.compute():
                    _, newlogprob, entropy, newvalue = self.model.get_action_and_value(mb.obs, mb.actions)
                loss, stats = ppo_loss(
                    newlogprob,
                    entropy,
                    newvalue,
                    mb.logprobs,
                    mb_advantages,
                    mb.returns,
                    mb.values,
                    self.loss_cfg,
                    mb.behavior_weights,
                )
                self.optimizer.zero_grad()
                (loss * weight if weight != 1 else loss).backward()
                grad_norm = self.backend.clip_grad_norm(self.model, cfg.max_grad_norm).detach().double()
                self.optimizer.step()
                grad_norms = grad_norm if grad_norms is None else grad_norms + grad_norm
                # means over the minibatch: this rank's weighted share (summed over ranks below)
                weighted = torch.stack([loss.detach(), *stats.values()]).double() * weight
                sums = weighted if sums is None else sums + weighted
                count += 1
            del shuffled, mb  # this epoch's copy of the batch goes before the next is gathered
            if cfg.target_kl is not None and self._minibatch_kl(stats["approx_kl"], weight) > cfg.target_kl:
                break
        per_minibatch = dict(zip(("loss", *stats), (sums / count).tolist(), strict=True))
        per_minibatch["grad_norm"] = float(grad_norms) / count
        if not all(np.isfinite(list(per_minibatch.values()))):
            raise WorkerError(
                f"PPO.train: the update went non-finite ({per_minibatch}); lower learning_rate or check the"
                " observations and rewards the simulator sends (NaN or inf?)"
            )
        self.version += 1
        self.updates += 1
        keys = sorted(per_minibatch)
        means = self.backend.mean_across_ranks(torch.tensor([per_minibatch[k] for k in keys], dtype=torch.float64))
        metrics = {f"actor/{k}": float(v) for k, v in zip(keys, means.tolist(), strict=True)}
        batch_means = self.backend.mean_across_ranks(  # every rank's share weighs alike: equal shares
            torch.tensor([float(returns.mean()), float(advantages.mean()), rewards_mean], dtype=torch.float64)
        ).tolist()
        metrics.update(
            {
                "actor/lr": self.optimizer.param_groups[0]["lr"],
                "rollout/returns_mean": batch_means[0],
                "rollout/advantages_mean": batch_means[1],
                "rollout/rewards_mean": batch_means[2],
                "actor/parts_streamed": float(len(parts) if streamed else 0),
                "actor/weights_version": float(self.version),
                "actor/steps_consumed": float(batch_size),
                **(staleness or {}),
            }
        )
        if behavior_weights is not None:
            metrics["actor/behavior_weight_mean"] = float(self.backend.mean_across_ranks(behavior_weights.mean()))
        return metrics

    def _staleness(self, batch: dict[str, Any]) -> dict[str, float] | None:
        """How many updates behind this one the policy that acted on each sample is, over every rank's
        samples (None when the inference worker does not record its version)."""
        import torch

        if "policy_version" not in batch:
            return None
        lag = (self.version - batch["policy_version"]).double()
        local = torch.stack([lag.max(), lag.sum(), lag.new_tensor(float(lag.numel()))])
        every = self.backend.gather_data_ranks(local.to(self.device))
        total, count = every[:, 1].sum(), every[:, 2].sum()
        return {"actor/staleness_max": float(every[:, 0].max()), "actor/staleness_mean": float(total / count)}

    def _proximal(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """The value and log-prob of every sample under the weights this update starts from, [T, envs],
        in minibatch-sized chunks (as many on every rank: a forward is a collective under FSDP)."""
        import torch

        from m2flow.workers.actor.samples import apply_to_obs

        with torch.no_grad():
            steps, envs = batch["reward"].shape
            rows = steps * envs
            obs, actions = flatten(batch["obs"]), batch["action"].reshape(rows, -1)
            chunk = self.cfg.minibatch_of(rows)
            chunks = -(-rows // chunk)
            if self.backend.data_world > 1:
                chunks = int(self.backend.gather_data_ranks(torch.tensor(chunks, device=self.device)).max())
            logprobs, values = [], []
            for c in range(chunks):
                start = min(c * chunk, rows - 1)  # a rank with fewer rows repeats its last one, then drops it
                end = min(start + chunk, rows)
                with self.backend.compute():
                    rows_of = lambda x: x[start:end]  # noqa: B023, E731 (used at once)
                    _, logprob, _, value = self.model.get_action_and_value(
                        apply_to_obs(obs, rows_of), actions[start:end]
                    )
                if c * chunk < rows:
                    logprobs.append(logprob.float())
                    values.append(value.float().reshape(-1))
            return torch.cat(values).reshape(steps, envs), torch.cat(logprobs).reshape(steps, envs)

    def _global_env_ids(self, batch: dict[str, Any], envs: int) -> torch.Tensor:
        """The global index of each env column (simulators send `env_ids`; one rank may do without)."""
        import torch

        if "env_ids" in batch:
            return batch["env_ids"]
        if self.backend.data_world > 1:
            raise WorkerError(
                "PPO.train: data-parallel ranks need each trajectory's 'env_ids' (global env indices) to cut"
                " minibatches alike; the simulator's trajectory() must include them"
            )
        return torch.arange(envs, device=self.device)

    def _minibatch_kl(self, approx_kl: torch.Tensor, weight: float) -> float:
        """The approximate KL over the whole last minibatch (every rank's share): all ranks stop alike."""
        return float(self.backend.sum_data_ranks((approx_kl.double() * weight).reshape(1))) / self.backend.data_world

    def _normalize(self, advantages: torch.Tensor) -> torch.Tensor:
        """Advantages normalised over the whole minibatch, whose samples may sit on several ranks."""
        import torch

        from m2flow.workers.algorithms import normalize_advantages

        if self.backend.data_world == 1:
            return normalize_advantages(advantages)
        local = torch.stack(
            [advantages.sum(), advantages.square().sum(), advantages.new_tensor(float(len(advantages)))]
        )
        total, squares, n = self.backend.sum_data_ranks(local.double()).unbind()  # on the device: no sync
        mean = total / n
        var = ((squares - n * mean * mean) / (n - 1).clamp(min=1)).clamp(min=0)
        return ((advantages - mean) / (var.sqrt() + 1e-8)).to(advantages.dtype)

    def export(self, folder: str) -> str:
        """The trained policy as a Hugging Face checkpoint that `model: hf, path: <folder>` loads again."""
        if not hasattr(self.model, "export"):
            raise WorkerError(
                f"export writes Hugging Face checkpoints: model: hf only (this policy is {self.cfg.model})"
            )
        return str(self.model.export(folder))

    def offload(self) -> None:
        """Model and optimizer state to pinned host memory while others use the device (CUDA, one rank)."""
        import torch

        from m2flow.workers.models.placement import move_module, move_optimizer

        if self.device.type == "cuda" and self.backend.world_size == 1:
            move_module(self.model, torch.device("cpu"))
            move_optimizer(self.optimizer, torch.device("cpu"))
            torch.cuda.empty_cache()

    def onload(self) -> None:
        from m2flow.workers.models.placement import move_module, move_optimizer

        if self.device.type == "cuda" and self.backend.world_size == 1:
            move_module(self.model, self.device)
            move_optimizer(self.optimizer, self.device)

    def save_checkpoint(self, path: str) -> None:
        """Every rank writes its own shards; rank 0 adds the run's progress (`ppo_checkpoint`)."""
        scaler = self._scaler_state()  # a collective: every rank takes part
        progress = None
        if self.backend.rank == 0:
            progress = {"generator": self.generator.get_state(), "version": self.version, "updates": self.updates}
            if scaler is not None:
                progress["reward_scaler"] = scaler
        ppo_checkpoint.write(Path(path), self.backend.sharded_state(self.model, self.optimizer), progress)

    def _scaler_state(self) -> dict[str, torch.Tensor] | None:
        """The reward scaler with every env's running return: each data-parallel rank adds its own envs'."""
        import torch

        if self.scaler is None:
            return None
        state = self.scaler.state_dict()
        if self.backend.data_world > 1:
            owned = torch.zeros_like(state["returns"])
            owned[self._env_ids.cpu()] = 1.0
            state = {**state, "returns": self.backend.sum_data_ranks(state["returns"] * owned)}
        return state

    def load_checkpoint(self, path: str) -> None:
        from m2flow.workers.algorithms import ReturnScaler

        state = self.backend.sharded_state(self.model, self.optimizer)  # the layout to fill in, for this run
        progress = ppo_checkpoint.read_into(Path(path), state)
        self.backend.load_sharded_state(self.model, self.optimizer, state)
        self.generator.set_state(progress["generator"])
        self.version, self.updates = int(progress["version"]), int(progress["updates"])
        if "reward_scaler" in progress:
            self.scaler = ReturnScaler(progress["reward_scaler"]["returns"].shape[0], self.cfg.gamma)
            self.scaler.load_state_dict(progress["reward_scaler"])


def _memory_parts(cfg: PPOConfig, samples: int) -> tuple[float, float]:
    """Bytes a rank holds: the policy's state as loaded, with what training changes (all of it, or LoRA's
    adapters and the heads) as fp32 master weights, their gradients and Adam's two moments (with `cpu_offload`
    about one block's at a time); and the activations a minibatch of its `samples` keeps for backward."""
    size = state_size(cfg)
    trained = size.bytes - size.trainable_bytes + 4 * 4 * size.trainable  # fp32 masters, gradients, Adam's moments
    state = size.bytes / cfg.blocks() if cfg.cpu_offload else trained
    minibatch = cfg.minibatch_of(max(1, samples))
    return state, activation_bytes(cfg.stacks(), minibatch, cfg.activation_checkpointing, cfg.precision == "bf16")
