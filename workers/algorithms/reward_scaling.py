"""Reward scaling by the running std of the discounted return, as gymnasium's NormalizeReward
(used by CleanRL) does per env step, applied here to a time-major batch of rewards."""

from __future__ import annotations

import torch


class ReturnScaler:
    def __init__(self, num_envs: int, gamma: float, clip: float = 10.0, epsilon: float = 1e-8):
        self.gamma, self.clip, self.epsilon = gamma, clip, epsilon
        self.returns = torch.zeros(num_envs, dtype=torch.float64)
        self.mean = torch.zeros((), dtype=torch.float64)
        self.var = torch.ones((), dtype=torch.float64)
        self.count = torch.tensor(1e-4, dtype=torch.float64)

    def __call__(self, rewards: torch.Tensor, dones: torch.Tensor) -> torch.Tensor:
        """`rewards[t]` follows `obs[t]`; `dones[t]` says obs[t] began an episode (its return restarts)."""
        scaled = torch.empty_like(rewards)
        for t in range(rewards.shape[0]):
            self.returns = self.returns * self.gamma * (1.0 - dones[t].double()) + rewards[t].double()
            self._update(self.returns)
            scaled[t] = (rewards[t].double() / torch.sqrt(self.var + self.epsilon)).clamp(-self.clip, self.clip).float()
        return scaled

    def _update(self, x: torch.Tensor) -> None:
        batch_mean, batch_var, n = x.mean(), x.var(unbiased=False), x.numel()
        delta, total = batch_mean - self.mean, self.count + n
        self.mean = self.mean + delta * n / total
        self.var = (self.var * self.count + batch_var * n + delta.square() * self.count * n / total) / total
        self.count = total

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"returns": self.returns, "mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.returns, self.mean = state["returns"].clone(), state["mean"].clone()
        self.var, self.count = state["var"].clone(), state["count"].clone()
