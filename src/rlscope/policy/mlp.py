"""The bandit policy: an MLP over a fixed-length prompt of integer features (TASKS.md,
``digits_bandit``: MLP 64 → 50 → 50 → 10 with ReLU).

A bandit is a one-token completion, so the MLP is seen through the `Policy` protocol of a
causal LM (`rlscope.policy.base`) and the generic sampler and learner run unchanged:

- the first ``n_inputs`` tokens of a sequence are the prompt, integer levels
  ``0 .. max_level``; the features are ``tokens / max_level`` in [0, 1];
- ``forward(tokens_BT)`` returns the action logits ``[B, T, n_actions]`` at **every**
  position (the same logits broadcast along T): the learner reads position ``P − 1`` (the last
  prompt position), which predicts the completion's one token, and no position can see the
  action, so nothing leaks; ``hidden_BTD`` is the last hidden layer, broadcast likewise, for a
  value head;
- the output width is ``n_actions`` (``vocab_size`` here means the *output* vocabulary, the
  width of the logits the sampler draws from): actions are the completion tokens
  ``0 .. n_actions − 1``, while prompt tokens range over ``0 .. max_level``;
- ``prefill`` returns the action logits; ``decode_step`` raises, because a completion has
  exactly one token (a second token would have no meaning).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class MLPConfig:
    """Shape of the bandit MLP."""

    n_inputs: int = 64
    """Prompt length: the number of integer features."""
    max_level: int = 16
    """Largest feature value; features are ``token / max_level``."""
    hidden: tuple[int, ...] = (50, 50)
    """Widths of the hidden layers (ReLU after each)."""
    n_actions: int = 10
    """Output width: the number of actions (completion token ids ``0 .. n_actions − 1``)."""


class MLPPolicy(nn.Module):
    """A contextual-bandit policy with the `Policy` protocol (see the module docstring)."""

    def __init__(self, cfg: MLPConfig) -> None:
        super().__init__()
        if cfg.n_inputs < 1 or cfg.max_level < 1 or cfg.n_actions < 2 or not cfg.hidden \
                or min(cfg.hidden) < 1:
            raise ValueError(f"invalid MLPConfig {cfg}: need n_inputs >= 1, max_level >= 1, "
                             "n_actions >= 2 and at least one hidden layer of width >= 1")
        self.cfg = cfg
        self.vocab_size = cfg.n_actions
        self.hidden_size = cfg.hidden[-1]
        widths = (cfg.n_inputs, *cfg.hidden)
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(widths))
        self.head = nn.Linear(cfg.hidden[-1], cfg.n_actions)

    def features(self, tokens_BT: torch.Tensor) -> torch.Tensor:
        """The prompt's features ``[B, n_inputs]`` in [0, 1] (the first ``n_inputs`` tokens)."""
        n = self.cfg.n_inputs
        if tokens_BT.dim() != 2 or tokens_BT.shape[1] < n:
            raise ValueError(f"MLPPolicy reads a prompt of {n} tokens; got tokens of shape "
                             f"{tuple(tokens_BT.shape)}")
        return tokens_BT[:, :n].to(self.head.weight.dtype) / self.cfg.max_level

    def _act(self, tokens_BT: torch.Tensor, attention_mask_BT: torch.Tensor | None
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logits_BV, hidden_BD)`` of the prompt."""
        if attention_mask_BT is not None and not bool(
                attention_mask_BT[:, :self.cfg.n_inputs].bool().all()):
            raise ValueError("MLPPolicy prompts have a fixed length and are never padded")
        x_BD = self.features(tokens_BT)
        for layer in self.layers:
            x_BD = F.relu(layer(x_BD))
        return self.head(x_BD), x_BD

    def forward(self, tokens_BT: torch.Tensor, attention_mask_BT: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logits_BTV, hidden_BTD)``: the prompt's action logits and last hidden layer,
        the same at every one of the T positions (T >= n_inputs)."""
        logits_BV, hidden_BD = self._act(tokens_BT, attention_mask_BT)
        T = tokens_BT.shape[1]
        return (logits_BV[:, None].expand(-1, T, -1), hidden_BD[:, None].expand(-1, T, -1))

    def init_cache(self, batch_size: int, max_len: int) -> None:
        """The MLP keeps no per-position state: there is no cache."""
        return None

    def prefill(self, tokens_BT: torch.Tensor, attention_mask_BT: torch.Tensor | None,
                cache: None) -> torch.Tensor:
        """The action logits ``logits_BV`` of the prompt ``tokens_BT``."""
        return self._act(tokens_BT, attention_mask_BT)[0]

    def decode_step(self, tokens_B: torch.Tensor, cache: None) -> torch.Tensor:
        """Never valid: a bandit completion is exactly one token (the action)."""
        raise ValueError("MLPPolicy is a bandit policy: a completion is one action token; "
                         "set sampling.max_new_tokens to 0 (the task's length) or 1")
