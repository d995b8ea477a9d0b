"""`TabularPolicy`: one free categorical per (prompt, depth) (COMPANIONS.md §5, the
``unique_path`` task's model).

A prompt is one token, the prompt id x in 0..N − 1; the completion is H actions in 0..b − 1.
The action at depth d is drawn from softmax(table[x, d]) whatever the earlier actions were: on
``unique_path`` a wrong action ends the episode, so the only state that matters at depth d is
the one reached by d right actions, and a table per (prompt, depth) is the exact tabular
policy. Seen through the `Policy` protocol of a causal LM (`rlscope.policy.base`):

- ``forward(tokens_BT)`` returns ``logits_BTV`` with position t holding table[x, min(t, H − 1)]:
  position 0 (the prompt) predicts the first action, position t the action at depth t;
  ``hidden_BTD`` is zeros of width 1 (there is no representation to read);
- ``vocab_size`` is the output width b (prompt ids range over 0..N − 1);
- ``prefill`` / ``decode_step`` keep the prompt ids and the depth in a small cache.

Initialisation (``initial_correct_probability`` p₀): the target action's logit is
log(p₀(b − 1)/(1 − p₀)) and every other logit 0, so π(target | x, d) = p₀ exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class TabularCache:
    """Decoding state: the prompt ids ``[B]`` and the depth of the next action."""

    prompt_B: torch.Tensor | None = None
    depth: int = 0


def target_logit(initial_correct_probability: float, branching: int) -> float:
    """The logit that gives the target probability p₀ against b − 1 zero logits:
    log(p₀(b − 1)/(1 − p₀))."""
    p = initial_correct_probability
    return math.log(p * (branching - 1) / (1 - p))


class TabularPolicy(nn.Module):
    """Logits ``table_NHb`` (a parameter) of one categorical per (prompt, depth)."""

    def __init__(self, targets_NH: torch.Tensor, branching: int,
                 initial_correct_probability: float) -> None:
        super().__init__()
        if targets_NH.dim() != 2 or branching < 2 or not 0 < initial_correct_probability < 1:
            raise ValueError("TabularPolicy needs targets [N, H], branching >= 2 and an initial "
                             f"correct probability in (0, 1); got shape "
                             f"{tuple(targets_NH.shape)}, b={branching}, "
                             f"p0={initial_correct_probability}")
        n, h = targets_NH.shape
        table_NHb = torch.zeros(n, h, branching)
        table_NHb.scatter_(-1, targets_NH[..., None].long(),
                           target_logit(initial_correct_probability, branching))
        self.table_NHb = nn.Parameter(table_NHb)
        self.vocab_size = branching
        self.hidden_size = 1
        self.horizon = h

    def _logits(self, prompt_B: torch.Tensor, depth_T: torch.Tensor) -> torch.Tensor:
        """``[B, T, b]``: table[x_b, min(depth_t, H − 1)]."""
        depth_T = depth_T.clamp(max=self.horizon - 1)
        return self.table_NHb[prompt_B[:, None], depth_T[None, :]]

    def forward(self, tokens_BT: torch.Tensor, attention_mask_BT: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logits_BTV, hidden_BTD)``; the prompt id is the first token of each row."""
        if attention_mask_BT is not None and not bool(attention_mask_BT[:, 0].bool().all()):
            raise ValueError("TabularPolicy prompts are one token and never padded")
        B, T = tokens_BT.shape
        logits_BTV = self._logits(tokens_BT[:, 0], torch.arange(T, device=tokens_BT.device))
        return logits_BTV, logits_BTV.new_zeros(B, T, 1)

    def probabilities_NH(self, targets_NH: torch.Tensor) -> torch.Tensor:
        """π(target | x, d) for every prompt and depth, ``[N, H]`` (no grad)."""
        with torch.no_grad():
            logp_NHb = self.table_NHb.float().log_softmax(-1)
            return logp_NHb.gather(-1, targets_NH[..., None].to(logp_NHb.device)
                                   .long())[..., 0].exp()

    def init_cache(self, batch_size: int, max_len: int) -> TabularCache:
        return TabularCache()

    def prefill(self, tokens_BT: torch.Tensor, attention_mask_BT: torch.Tensor | None,
                cache: TabularCache) -> torch.Tensor:
        """The logits of the first action, ``[B, b]``; the prompt is its first token."""
        if tokens_BT.shape[1] != 1:
            raise ValueError(f"TabularPolicy prompts are one token (the prompt id); got "
                             f"{tokens_BT.shape[1]}")
        cache.prompt_B, cache.depth = tokens_BT[:, 0], 0
        return self.table_NHb[cache.prompt_B, 0]

    def decode_step(self, tokens_B: torch.Tensor, cache: TabularCache) -> torch.Tensor:
        """The logits of the next depth's action, ``[B, b]``."""
        if cache.prompt_B is None:
            raise ValueError("decode_step needs a prefilled cache; call prefill first")
        cache.depth += 1
        return self.table_NHb[cache.prompt_B, min(cache.depth, self.horizon - 1)]
