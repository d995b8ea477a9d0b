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

import functools
import types
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, runtime_checkable

import torch

F = TypeVar("F", bound=Callable[..., Any])


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

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any: ...

    def named_parameters(self, *args: Any, **kwargs: Any) -> Any: ...


def position_ids_from_mask(attention_mask_BT: torch.Tensor) -> torch.Tensor:
    """Positions 0, 1, ... counted over real tokens only (left padding gets position 0)."""
    return (attention_mask_BT.long().cumsum(-1) - 1).clamp_min(0)


def autocast_outputs(method: F) -> F:
    """Run a policy method under ``torch.autocast`` when ``self.autocast_dtype`` is set.

    Mixed precision with float32 master weights (Micikevicius et al. arXiv:1710.03740): the
    parameters, their gradients and the optimizer state stay float32; matmuls run in bf16;
    every floating output (logits, hidden states) comes back as float32, so log-softmax, the
    loss and the sampler's draw are computed in full precision. bf16 keeps float32's exponent
    range, so no loss scaling is needed. ``cache_enabled=False`` because each call is its own
    autocast region (a weight cache would not outlive it) and because CUDA graph capture
    cannot hold autocast's cache. The device type is taken from the first argument (the token
    ids), which lives on the model's device.
    """

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        dtype = getattr(self, "autocast_dtype", None)
        if dtype is None:
            return method(self, *args, **kwargs)
        with torch.autocast(args[0].device.type, dtype=dtype, cache_enabled=False):
            out = method(self, *args, **kwargs)
        if isinstance(out, tuple):
            return tuple(_float32(x) for x in out)
        return _float32(out)

    return wrapper  # type: ignore[return-value]


def _float32(x: Any) -> Any:
    return x.float() if isinstance(x, torch.Tensor) and x.is_floating_point() else x


def _fp32_linear(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``nn.Linear.forward`` outside autocast, in float32 at least (a float64 head stays)."""
    dtype = torch.promote_types(self.weight.dtype, torch.float32)
    with torch.autocast(x.device.type, enabled=False):
        bias = None if self.bias is None else self.bias.to(dtype)
        return torch.nn.functional.linear(x.to(dtype), self.weight.to(dtype), bias)


def fp32_output_head(policy: Any) -> bool:
    """Make ``policy``'s output head (the LM head ``nn.Linear``) compute its logits in float32
    under mixed precision (ScaleRL's fp32 head, METHODS_2026.md §2 ``fp32_head``): its matmul
    leaves the autocast region and reads float32 hidden states; the log-softmax after it is
    float32 already (`autocast_outputs`). Every call through the module is covered: the
    learner's padded forward and the policy's own prefill/decode (the ``hf`` and ``tiny``
    samplers), and the packed learner, which applies the head weights itself, reads
    `head_dtype`. Not covered: a static sampler's separate weight copy. Returns
    whether a plain ``nn.Linear`` head was found and patched (a no-op numerically without
    ``--autocast``). The patch is a bound method, so a deep copy (the KL reference) keeps it
    on its own weights."""
    head: Any = getattr(policy, "head", None)
    if head is None and hasattr(policy, "model"):
        head = policy.model.get_output_embeddings()
    if type(head) is not torch.nn.Linear:
        return False
    head.forward = types.MethodType(_fp32_linear, head)  # type: ignore[method-assign]
    return True


def head_dtype(policy: Any) -> torch.dtype | None:
    """The dtype the policy's LM head multiplies in under mixed precision: None (float32 at
    least) once `fp32_output_head` patched it, else the policy's ``autocast_dtype`` (None
    without autocast). For code that applies the head weights itself (the packed learner)."""
    head: Any = getattr(policy, "head", None)
    if head is None and hasattr(policy, "model"):
        head = policy.model.get_output_embeddings()
    if getattr(getattr(head, "forward", None), "__func__", None) is _fp32_linear:
        return None
    return getattr(policy, "autocast_dtype", None)
