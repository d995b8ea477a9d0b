"""`SetPolicy`: the ``vector_pareto`` task's model (COMPANIONS.md §2, VPO).

A set of M candidates answers one prompt; slot m of prompt p has its own categorical over the
A actions, logits(p, m) = W₂ tanh(W₁(E_p[p] + E_s[m]) + c₁) + c₂, with a prompt embedding E_p
(P × h), a slot embedding E_s (M × h), W₁ (h × h) and W₂ (A × h), all at PyTorch's default
initialisation. The slots share everything but their embedding, so they can specialise to
different answers. Each slot samples one action independently.
"""

from __future__ import annotations

import torch
from torch import nn


class SetPolicy(nn.Module):
    """M independent categorical slots per prompt over a shared tanh MLP."""

    def __init__(self, num_prompts: int, num_slots: int, num_actions: int, hidden: int) -> None:
        super().__init__()
        self.prompt_embedding = nn.Embedding(num_prompts, hidden)
        """E_p, ``[P, h]``."""
        self.slot_embedding = nn.Embedding(num_slots, hidden)
        """E_s, ``[M, h]``."""
        self.hidden = nn.Linear(hidden, hidden)
        """W₁ and c₁."""
        self.head = nn.Linear(hidden, num_actions)
        """W₂ and c₂."""

    @property
    def num_slots(self) -> int:
        return int(self.slot_embedding.num_embeddings)

    def forward(self, prompt_ids_B: torch.Tensor) -> torch.Tensor:
        """``[B, M, A]`` logits of every slot of each row's prompt."""
        x_BMH = self.prompt_embedding(prompt_ids_B)[:, None, :] + self.slot_embedding.weight
        return self.head(torch.tanh(self.hidden(x_BMH)))

    def log_probs(self, prompt_ids_B: torch.Tensor) -> torch.Tensor:
        """``[B, M, A]`` log π(a | p, m)."""
        return torch.log_softmax(self(prompt_ids_B), dim=-1)


def sample_sets(logp_BMA: torch.Tensor, generator: torch.Generator
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """One action per slot drawn at temperature 1 (on the CPU, from ``generator``):
    ``(actions_BM, logp_BM)``, the latter the detached log-prob of each drawn action."""
    B, M, A = logp_BMA.shape
    probs_NA = logp_BMA.detach().exp().reshape(B * M, A).float().cpu()
    actions_BM = torch.multinomial(probs_NA, 1, generator=generator).view(B, M)
    actions_BM = actions_BM.to(logp_BMA.device)
    return actions_BM, logp_BMA.detach().gather(-1, actions_BM[..., None])[..., 0]


def slot_entropy(logp_BMA: torch.Tensor) -> torch.Tensor:
    """``[B, M]`` entropy −Σ_a π log π of each slot's categorical."""
    return -(logp_BMA.exp() * logp_BMA).sum(-1)


__all__ = ["SetPolicy", "sample_sets", "slot_entropy"]
