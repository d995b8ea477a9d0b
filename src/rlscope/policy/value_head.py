"""A scalar value head on the policy's final hidden state (shared trunk, as in PPO for RLHF)."""

from __future__ import annotations

import torch
from torch import nn


class ValueHead(nn.Module):
    """V(s_t) = w · h_t + b, zero-initialised so the critic starts neutral."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden_BTD: torch.Tensor) -> torch.Tensor:
        """Values ``[B, T]`` from hidden states ``[B, T, D]``."""
        return self.linear(hidden_BTD.to(self.linear.weight.dtype)).squeeze(-1)
