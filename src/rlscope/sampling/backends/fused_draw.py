"""The static sampler's draw over a large vocabulary in two Triton passes over the logits.

`rlscope.sampling.draw.draw` at a plain temperature (no top-k, no top-p) computes the
log-softmax of the logits, the counter-based Gumbel noise of every (row, token)
(`rlscope.sampling.processors.uniform_noise_at`), the argmax of their difference and the
gathered log-probs. At Qwen2.5-0.5B's 151,936 tokens and batch 256, compiled, that was three
reductions over ``[256, 151936]`` taking 0.26 ms of a 1.6 ms decode position on one H100
(``benchmarks/profile_engine.py``). `fused_draw` does the same in two passes over the bf16
logits, each split over chunks of `CHUNK` columns so every row runs on many programs:

1. per (row, chunk): the max and shifted sum of exponentials of ``logits / T`` (and of the raw
   logits when ``T != 1``); combined per row into the log-sum-exp with a few ``[B, S]`` torch
   ops;
2. per (row, chunk): ``logp = (x/T - max) - log sum``, the row's noise from its (seed, step)
   hash (`processors.row_hash`, the same int64 arithmetic), the best ``logp - log(-log u)``
   and its first column, and the chunk's entropy and Σp² terms; the best chunk wins (first
   on ties, as ``argmax``).

The token is the Gumbel-max draw of the same noise as `draw` (a GPU test and the interpreter
test check the tokens are equal and the log-probs agree to float32 rounding; only the order
of the log-sum-exp's additions differs). Valid regime: ``temperature > 0`` without top-k or
top-p (`applies`), a vocabulary of at least `MIN_VOCAB`, CUDA with Triton (or Triton's CPU
interpreter in tests, `ON_CPU`).
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

import torch

from rlscope.sampling.draw import Draw, SamplingConfig
from rlscope.sampling.processors import row_hash

CHUNK = 8192
"""Columns per program (the vocabulary is split into ``ceil(V / CHUNK)`` chunks per row)."""
BLOCK = 1024
"""Columns per step of a program's loop."""
MIN_VOCAB = 16384
"""Below this vocabulary the compiled `draw` is one small kernel already: not used."""
ON_CPU = False
"""Tests: run the kernels on CPU tensors (Triton's interpreter, ``TRITON_INTERPRET=1``)."""
_KERNELS: dict[str, Any] = {}


def applies(cfg: SamplingConfig, vocab: int, device: torch.device) -> bool:
    """Whether `fused_draw` replaces `draw` for ``cfg`` at this vocabulary and device."""
    plain = cfg.temperature > 0 and not 0 < cfg.top_k < vocab and cfg.top_p >= 1.0
    return plain and vocab >= MIN_VOCAB and (device.type == "cuda" or ON_CPU) \
        and importlib.util.find_spec("triton") is not None


def _kernels() -> dict[str, Any]:
    """The Triton kernels (`draw_kernels`), imported on first use."""
    if not _KERNELS:
        from rlscope.sampling.backends import draw_kernels

        _KERNELS.update(stats=draw_kernels.chunk_stats_kernel,
                        draw=draw_kernels.chunk_draw_kernel)
    return _KERNELS


def load() -> None:
    """Import the kernels now, before ``torch.compile`` traces a caller (why:
    `rlscope.sampling.backends.decode_attention.load`)."""
    _kernels()


def reset() -> None:
    """Forget the kernels (tests switching ``TRITON_INTERPRET``)."""
    _KERNELS.clear()
    sys.modules.pop("rlscope.sampling.backends.draw_kernels", None)


def _log_sum_exp(m_BS: torch.Tensor, s_BS: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(max, log sum)`` per row from per-chunk maxima and shifted sums."""
    m_B = m_BS.amax(1)
    return m_B, (s_BS * (m_BS - m_B[:, None]).exp()).sum(1).log()


def fused_draw(logits_BV: torch.Tensor, alive_B: torch.Tensor | None, seeds_B: torch.Tensor,
               step: torch.Tensor, cfg: SamplingConfig, pad_token_id: int, with_entropy: bool,
               with_sum_p2: bool = False) -> Draw:
    """`draw` of ``logits_BV`` with the Gumbel noise of (``seeds_B``, ``step``) (check
    `applies`): the same token, log-probs, entropy and Σp². Graph-safe."""
    B, V = logits_BV.shape
    if logits_BV.stride(1) != 1:
        logits_BV = logits_BV.contiguous()
    T = float(cfg.temperature)
    raw = T != 1.0
    S = -(-V // CHUNK)
    device = logits_BV.device
    k = _kernels()
    temperature_1 = torch.full((1,), T, dtype=torch.float32, device=device)
    stats_BS4 = torch.empty(B, S, 4, dtype=torch.float32, device=device)
    k["stats"][(B, S)](logits_BV, stats_BS4, V, logits_BV.stride(0), temperature_1,
                       CHUNK=CHUNK, BLOCK=BLOCK, RAW=raw)
    m_B, lse_B = _log_sum_exp(stats_BS4[..., 0], stats_BS4[..., 1])
    m1_B, lse1_B = _log_sum_exp(stats_BS4[..., 2], stats_BS4[..., 3]) if raw else (m_B, lse_B)
    norm_B4 = torch.stack([m_B, lse_B, m1_B, lse1_B], 1)
    best_BS = torch.empty(B, S, dtype=torch.float32, device=device)
    index_BS = torch.empty(B, S, dtype=torch.int32, device=device)
    ent_BS = torch.empty(B, S, dtype=torch.float32, device=device)
    p2_BS = torch.empty(B, S, dtype=torch.float32, device=device)
    k["draw"][(B, S)](logits_BV, norm_B4, row_hash(seeds_B, step), best_BS, index_BS, ent_BS,
                      p2_BS, V, logits_BV.stride(0), temperature_1, CHUNK=CHUNK, BLOCK=BLOCK,
                      RAW=raw, ENTROPY=with_entropy, SUM_P2=with_sum_p2)
    token_B = index_BS.gather(1, best_BS.argmax(1, keepdim=True))[:, 0].long()
    if alive_B is not None:
        token_B = torch.where(alive_B, token_B, pad_token_id)
    x_B = logits_BV.gather(1, token_B[:, None])[:, 0].float()
    logp_B = (x_B / T - m_B) - lse_B
    return Draw(token_B=token_B, logp_sampler_B=logp_B,
                logp_raw_B=(x_B - m1_B) - lse1_B if raw else logp_B, keep_BV=None,
                entropy_B=-ent_BS.sum(1) if with_entropy else None,
                sum_p2_B=p2_BS.sum(1) if with_sum_p2 else None)
