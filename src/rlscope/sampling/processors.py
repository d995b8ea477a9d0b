"""Logit processing shared by the sampler and the learner, and the sampler's noise source.

The sampler draws from ``softmax(mask(logits / T))`` where ``mask`` keeps the top-k / top-p set;
the learner recomputes exactly this distribution (temperature always; the kept set replayed
from the rollout when ``replay_sampling_mask`` is on), so the first on-policy pass has ratio 1.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

_NEG_INF = float("-inf")


def keep_mask(logits_NV: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor | None:
    """Boolean mask of the tokens top-k and then top-p keep, or None when neither is active.

    top-k keeps the ``top_k`` largest logits (ties broken by index, as ``torch.topk``); top-p
    then keeps the smallest prefix of the remaining tokens, sorted by probability, whose mass
    reaches ``top_p`` (the token that crosses the threshold is kept). ``logits_NV`` must already
    be divided by the temperature.
    """
    V = logits_NV.shape[-1]
    use_k = 0 < top_k < V
    use_p = top_p < 1.0
    if not (use_k or use_p):
        return None
    sorted_NV, order_NV = logits_NV.sort(dim=-1, descending=True, stable=True)
    keep_sorted_NV = torch.ones_like(sorted_NV, dtype=torch.bool)
    if use_k:
        keep_sorted_NV[..., top_k:] = False
    if use_p:
        probs_NV = sorted_NV.masked_fill(~keep_sorted_NV, _NEG_INF).softmax(-1)
        mass_before_NV = probs_NV.cumsum(-1) - probs_NV
        keep_sorted_NV &= mass_before_NV < top_p
    return torch.zeros_like(keep_sorted_NV).scatter(-1, order_NV, keep_sorted_NV)


def processed_logprobs(logits_NV: torch.Tensor, temperature: float,
                       keep_NV: torch.Tensor | None) -> torch.Tensor:
    """Log-probabilities of the sampling distribution: temperature, then the kept set."""
    # At least float32: half-precision logits are upcast, float64 stays float64.
    scaled_NV = logits_NV.to(torch.promote_types(logits_NV.dtype, torch.float32))
    if temperature != 1.0:
        scaled_NV = scaled_NV / temperature
    if keep_NV is not None:
        scaled_NV = scaled_NV.masked_fill(~keep_NV, _NEG_INF)
    return scaled_NV.log_softmax(-1)


@dataclass(frozen=True)
class SampledDistribution:
    """The distribution the sampler drew from, as the learner recomputes it: the logits divided
    by ``temperature`` (0, greedy, reads as 1) and, with ``replay_keep``, restricted to the
    rollout's recorded top-k/top-p kept set (``RolloutBatch.keep_mask_BTV``). One value per
    run, threaded through every teacher-forced forward (learner, candidates, diagnostics)."""

    temperature: float = 1.0
    replay_keep: bool = True

    def logprobs(self, logits_NV: torch.Tensor, keep_NV: torch.Tensor | None) -> torch.Tensor:
        """``[..., V]`` log-probs of this distribution; ``keep_NV`` (the rollout's kept set, or
        None) counts only with ``replay_keep``."""
        return processed_logprobs(logits_NV, self.temperature if self.temperature > 0 else 1.0,
                                  keep_NV if self.replay_keep else None)

    def without_keep(self) -> SampledDistribution:
        """The same temperature over the whole vocabulary (for tokens the sampler did not
        draw, e.g. the task's labels)."""
        return dataclasses.replace(self, replay_keep=False)


_M1 = 0xFF51AFD7ED558CCD - (1 << 64)
_M2 = 0xC4CEB9FE1A85EC53 - (1 << 64)
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
_LOW31 = (1 << 31) - 1


def _fmix64(x: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 64-bit finaliser on int64 tensors (logical shifts emulated by masking)."""
    x = x ^ ((x >> 33) & _LOW31)
    x = x * _M1
    x = x ^ ((x >> 33) & _LOW31)
    x = x * _M2
    return x ^ ((x >> 33) & _LOW31)


def _wrap64(value: int) -> int:
    """``value`` modulo 2**64 as a signed int64 (two's complement, as torch's int64 wraps)."""
    return (value + (1 << 63)) % (1 << 64) - (1 << 63)


def uniform_noise(row_seeds: torch.Tensor, step: int | torch.Tensor,
                  width: int) -> torch.Tensor:
    """Counter-based uniforms in (0, 1), ``[*S, width]``, a pure function of (seed, step, column).

    Each row's stream depends only on its own seed, so a prompt sampled inside any batch gets
    exactly the samples it gets alone — batch layout never changes a result. ``row_seeds`` and
    ``step`` broadcast to the leading shape ``S``: ``[N]`` seeds and an int step give
    ``[N, width]``; ``[N, 1]`` seeds and a ``[T]`` device tensor of steps give every step at
    once, ``[N, T, width]``, bit for bit the same numbers (int64 arithmetic wraps the same way).
    """
    return uniform_noise_at(row_seeds, step, column_keys(width, row_seeds.device))


def column_keys(width: int, device: torch.device) -> torch.Tensor:
    """``[width]`` int64 keys of the vocabulary columns, `uniform_noise_at`'s last input."""
    return torch.arange(width, device=device, dtype=torch.long) * _GOLDEN


def row_hash(row_seeds: torch.Tensor, step: int | torch.Tensor) -> torch.Tensor:
    """The int64 hash of (seed, step) that `uniform_noise_at` adds each column's key to before
    the final mix (shape of ``row_seeds`` broadcast with ``step``)."""
    # a Python-int step is wrapped to int64 here as a tensor step wraps in torch (past step
    # ~187, (step + 1) * _M1 no longer fits int64 and torch would refuse the int)
    offset = _wrap64((step + 1) * _M1) if isinstance(step, int) else (step + 1) * _M1
    return _fmix64(row_seeds * _GOLDEN + offset)


def uniform_noise_at(row_seeds: torch.Tensor, step: int | torch.Tensor,
                     column_keys_V: torch.Tensor) -> torch.Tensor:
    """`uniform_noise` with the column keys given (`column_keys`): the same numbers. A
    compiled kernel then reads the keys rather than multiplying its column index by a 64-bit
    constant (which ``torch.compile``'s Triton code cannot do: the index is 32-bit)."""
    x = row_hash(row_seeds, step)[..., None] + column_keys_V
    bits = (_fmix64(x) >> 40) & ((1 << 24) - 1)
    return (bits.float() + 0.5) / float(1 << 24)


def gumbel_offsets_at(row_seeds: torch.Tensor, step: int | torch.Tensor,
                      column_keys_V: torch.Tensor) -> torch.Tensor:
    """`gumbel_offsets` with the column keys given (see `uniform_noise_at`)."""
    return (-uniform_noise_at(row_seeds, step, column_keys_V).log()).log()


def gumbel_offsets(row_seeds: torch.Tensor, step: int | torch.Tensor,
                   width: int) -> torch.Tensor:
    """``log(−log u)`` of `uniform_noise` (minus standard Gumbel draws), ``[*S, width]``.

    ``argmax(logp − offsets)`` draws one token from ``exp(logp)`` (the Gumbel-max trick).
    """
    return (-uniform_noise(row_seeds, step, width).log()).log()
