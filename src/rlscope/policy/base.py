"""The `Policy` protocol every model implements, and helpers shared by the implementations.

A policy is a causal language model seen through three calls:

- ``forward(tokens_BT, attention_mask_BT)`` — full teacher-forced forward, returns
  ``(logits_BTV, hidden_BTD)``; the learner uses it.
- ``init_cache(batch_size, max_len)`` — an empty KV cache for ``batch_size`` rows.
- ``prefill(tokens_BT, attention_mask_BT, cache)`` and ``decode_step(tokens_B, cache)`` —
  incremental decoding; both return the logits of the *last* position, ``logits_BV``.

Padding convention: prompts are **left**-padded; ``attention_mask_BT`` is 1 on real tokens.
Position ids are derived from the mask (``cumsum(mask) - 1``), so a padded row sees the same
positions as the unpadded prompt alone. Generated tokens are appended on the right; tokens after
a row finished are ignored through the loss mask, never through attention (causality makes them
harmless to every earlier position).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class Policy(Protocol):
    """A causal LM usable by the sampler and the learner (see the module docstring)."""

    vocab_size: int
    hidden_size: int

    def forward(
        self, tokens_BT: torch.Tensor, attention_mask_BT: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def init_cache(self, batch_size: int, max_len: int) -> Any: ...

    def prefill(
        self, tokens_BT: torch.Tensor, attention_mask_BT: torch.Tensor | None, cache: Any
    ) -> torch.Tensor: ...

    def decode_step(self, tokens_B: torch.Tensor, cache: Any) -> torch.Tensor: ...

    def parameters(self, recurse: bool = True) -> Any: ...

    def to(self, *args: Any, **kwargs: Any) -> Any: ...

    def train(self, mode: bool = True) -> Any: ...

    def eval(self) -> Any: ...

    def state_dict(self, *args: Any, **kwargs: Any) -> Any: ...


def position_ids_from_mask(attention_mask_BT: torch.Tensor) -> torch.Tensor:
    """Positions 0, 1, ... counted over real tokens only (left padding gets position 0)."""
    return (attention_mask_BT.long().cumsum(-1) - 1).clamp_min(0)
