"""Reward scaling by the running std of the discounted return, as gymnasium's NormalizeReward
(used by CleanRL) does per env step, applied here to a time-major batch of rewards.

The running return of each env is kept by its global env id, so a data-parallel rank updates only its
own envs while the statistics — over every env of the step — are the same on all ranks.
"""

from __future__ import annotations

import torch

from m2flow.workers.algorithms.moments import Combine, merge


class ReturnScaler:
    def __init__(self, num_envs: int, gamma: float, clip: float = 10.0, epsilon: float = 1e-8):
        self.gamma, self.clip, self.epsilon = gamma, clip, epsilon
        self.returns = torch.zeros(num_envs, dtype=torch.float64)  # by global env id
        self.mean = torch.zeros((), dtype=torch.float64)
        self.var = torch.ones((), dtype=torch.float64)
        self.count = torch.tensor(1e-4, dtype=torch.float64)

    def __call__(
        self, rewards: torch.Tensor, dones: torch.Tensor, env_ids: torch.Tensor, combine: Combine | None = None
    ) -> torch.Tensor:
        """`rewards[t]` follows `obs[t]`; `dones[t]` says obs[t] began an episode (its return restarts).
        Columns are the envs `env_ids`; `combine` merges a step's moments with other ranks' envs."""
        returns = self.returns[env_ids]
        scaled = torch.empty_like(rewards)
        for t in range(rewards.shape[0]):
            returns = returns * self.gamma * (1.0 - dones[t].double()) + rewards[t].double()
            batch = (returns.mean(), returns.var(unbiased=False), returns.numel())
            self.mean, self.var, self.count = merge(
                self.mean, self.var, self.count, combine(*batch) if combine is not None else batch
            )
            scaled[t] = (rewards[t].double() / torch.sqrt(self.var + self.epsilon)).clamp(-self.clip, self.clip).float()
        self.returns[env_ids] = returns
        return scaled

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"returns": self.returns, "mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.returns, self.mean = state["returns"].clone(), state["mean"].clone()
        self.var, self.count = state["var"].clone(), state["count"].clone()
