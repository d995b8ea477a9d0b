"""Log-prob and entropy of chosen tokens from final hidden states, without the N×V logits.

`chunked_logp_entropy` computes, for N positions with final (post-norm) hidden states
``hidden_ND``, the output head ``W_VD`` (+ ``bias_V``) and chosen tokens ``tokens_N``:

- ``logp_N[n]`` = log softmax(z_n / τ)[tokens_N[n]], with z_n = W·h_n + b the logits;
- ``entropy_N[n]`` = −Σ_v p_v log p_v of that same distribution p = softmax(z_n / τ).

It walks the positions in chunks of ``chunk`` rows; a custom autograd function keeps only the
inputs and the N log-sum-exps, and recomputes each chunk's logits in the backward pass, so the
extra memory at any moment is one chunk's ``[chunk, V]`` logits (forward and backward), never
``[N, V]``: at a 152k vocabulary the padded path's float32 logits of 16k tokens are ~10 GB.
Gradients reach ``hidden_ND``, ``W_VD`` and ``bias_V`` through both outputs (entropy-bonus
methods differentiate H):

    ∂logp/∂s = onehot(y) − p,   ∂H/∂s = −p ⊙ (log p + H),   s = z / τ.

The softmax arithmetic runs in float32 at least (a bf16 chunk of logits is upcast; float64
stays float64) with autocast off, whatever the dtype of the hidden states; the head's matmuls
run in ``matmul_dtype`` (bf16 under mixed precision, as the padded learner's head does).
Only the full-vocabulary distribution is supported (no top-k/top-p kept set): the learner
falls back to full logits otherwise.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["chunked_logp_entropy"]


def _scores(z_nV: torch.Tensor, b_V: torch.Tensor | None, temperature: float,
            dtype: torch.dtype) -> torch.Tensor:
    """Scaled logits ``s = (z + b) / τ`` in ``dtype``."""
    s_nV = z_nV.to(dtype)
    if b_V is not None:
        s_nV = s_nV + b_V
    if temperature != 1.0:
        s_nV = s_nV / temperature
    return s_nV


def forward_stats(z_nV: torch.Tensor, b_V: torch.Tensor | None, y_n: torch.Tensor,
                  temperature: float, dtype: torch.dtype
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One chunk's chosen ``logp_n``, ``entropy_n`` and log-sum-exp ``lse_n`` (in ``dtype``)
    from its logits ``z_nV`` (any dtype; upcast first)."""
    s_nV = _scores(z_nV, b_V, temperature, dtype)
    lse_n = s_nV.logsumexp(-1)
    logp_nV = s_nV - lse_n[:, None]
    entropy_n = -(logp_nV.exp() * logp_nV).sum(-1)
    return logp_nV.gather(-1, y_n[:, None]).squeeze(-1), entropy_n, lse_n


def score_grad(z_nV: torch.Tensor, b_V: torch.Tensor | None, y_n: torch.Tensor,
               lse_n: torch.Tensor, entropy_n: torch.Tensor, g_logp_n: torch.Tensor,
               g_ent_n: torch.Tensor, temperature: float, dtype: torch.dtype,
               out_dtype: torch.dtype) -> torch.Tensor:
    """``∂L/∂z`` ``[n, V]`` (in ``out_dtype``) of one chunk, given the upstream gradients of
    its chosen log-probs and entropies: ``(g_logp·(onehot(y) − p) − g_H·p·(log p + H)) / τ``,
    computed in ``dtype`` from the logits ``z_nV`` and the forward's ``lse_n``."""
    logp_nV = _scores(z_nV, b_V, temperature, dtype) - lse_n[:, None]
    p_nV = logp_nV.exp()
    onehot_nV = torch.arange(z_nV.shape[-1], device=z_nV.device)[None, :] == y_n[:, None]
    g_s_nV = torch.where(onehot_nV, g_logp_n[:, None], 0.0) \
        - p_nV * (g_logp_n[:, None] + g_ent_n[:, None] * (logp_nV + entropy_n[:, None]))
    if temperature != 1.0:
        g_s_nV = g_s_nV / temperature
    return g_s_nV.to(out_dtype)


COMPILE_CHUNKS = True
"""On CUDA, run `forward_stats` and `score_grad` through ``torch.compile``: each becomes one
or two fused passes over a chunk's logits instead of ~10 float32 passes (the learner's
largest cost at a 152k vocabulary; see docs/performance.md)."""
_COMPILED: dict[str, Any] = {}


def chunk_kernels(device: torch.device) -> tuple[Any, Any]:
    """``(forward_stats, score_grad)``, compiled on CUDA when `COMPILE_CHUNKS` (built once per
    process; eager elsewhere and after a failed compile)."""
    if device.type != "cuda" or not COMPILE_CHUNKS or _COMPILED.get("failed"):
        return forward_stats, score_grad
    if "forward" not in _COMPILED:
        _COMPILED["forward"] = torch.compile(forward_stats, dynamic=None)
        _COMPILED["grad"] = torch.compile(score_grad, dynamic=None)
    return _COMPILED["forward"], _COMPILED["grad"]


def _run(kernel: Any, eager: Any, *args: Any) -> Any:
    """``kernel(*args)``, or ``eager(*args)`` for good if compiling fails (no Triton, no
    compiler)."""
    if kernel is eager:
        return eager(*args)
    try:
        return kernel(*args)
    except Exception:  # any compile failure means "run it eagerly"
        _COMPILED["failed"] = True
        return eager(*args)


class _ChunkedLogpEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, hidden_ND: torch.Tensor, W_VD: torch.Tensor,
                bias_V: torch.Tensor | None, tokens_N: torch.Tensor, temperature: float,
                chunk: int, matmul_dtype: torch.dtype | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = torch.promote_types(W_VD.dtype, torch.float32)
        N = hidden_ND.shape[0]
        logp_N = torch.empty(N, dtype=dtype, device=hidden_ND.device)
        entropy_N = torch.empty_like(logp_N)
        lse_N = torch.empty_like(logp_N)
        W_c = W_VD.to(matmul_dtype or dtype)
        b_c = None if bias_V is None else bias_V.to(dtype)
        stats, _ = chunk_kernels(hidden_ND.device)
        for i in range(0, N, chunk):
            z_nV = hidden_ND[i:i + chunk].to(W_c.dtype) @ W_c.T
            lp_n, ent_n, lse_n = _run(stats, forward_stats, z_nV, b_c,
                                      tokens_N[i:i + chunk], temperature, dtype)
            logp_N[i:i + chunk] = lp_n
            entropy_N[i:i + chunk] = ent_n
            lse_N[i:i + chunk] = lse_n
        ctx.save_for_backward(hidden_ND, W_VD, bias_V, tokens_N, entropy_N, lse_N)
        ctx.temperature, ctx.chunk, ctx.matmul_dtype = temperature, chunk, matmul_dtype
        return logp_N, entropy_N

    @staticmethod
    def backward(ctx: Any, g_logp_N: torch.Tensor | None, g_ent_N: torch.Tensor | None
                 ) -> tuple[torch.Tensor | None, ...]:
        hidden_ND, W_VD, bias_V, tokens_N, entropy_N, lse_N = ctx.saved_tensors
        temperature, chunk = ctx.temperature, ctx.chunk
        dtype = entropy_N.dtype
        mm_dtype = ctx.matmul_dtype or dtype
        W_c = W_VD.to(mm_dtype)
        b_c = None if bias_V is None else bias_V.to(dtype)
        need_h, need_W, need_b = ctx.needs_input_grad[:3]
        g_hidden_ND = torch.empty_like(hidden_ND) if need_h else None
        g_W_VD = torch.zeros(W_VD.shape, dtype=dtype, device=W_VD.device) if need_W else None
        g_b_V = torch.zeros_like(b_c) if need_b and b_c is not None else None
        g_logp_N = torch.zeros_like(lse_N) if g_logp_N is None else g_logp_N.to(dtype)
        g_ent_N = torch.zeros_like(lse_N) if g_ent_N is None else g_ent_N.to(dtype)
        _, grad = chunk_kernels(hidden_ND.device)
        for i in range(0, hidden_ND.shape[0], chunk):
            h_nD = hidden_ND[i:i + chunk].to(mm_dtype)
            sl = slice(i, i + chunk)
            g_s_nV = _run(grad, score_grad, h_nD @ W_c.T, b_c, tokens_N[sl], lse_N[sl],
                          entropy_N[sl], g_logp_N[sl], g_ent_N[sl], temperature, dtype,
                          dtype if g_b_V is not None else mm_dtype)
            if g_b_V is not None:
                g_b_V += g_s_nV.sum(0)
                g_s_nV = g_s_nV.to(mm_dtype)
            if g_hidden_ND is not None:
                g_hidden_ND[sl] = (g_s_nV @ W_c).to(hidden_ND.dtype)
            if g_W_VD is not None:
                g_W_VD += g_s_nV.T @ h_nD
        g_W = None if g_W_VD is None else g_W_VD.to(W_VD.dtype)
        g_b = None if g_b_V is None or bias_V is None else g_b_V.to(bias_V.dtype)
        return g_hidden_ND, g_W, g_b, None, None, None, None


def chunked_logp_entropy(hidden_ND: torch.Tensor, W_VD: torch.Tensor,
                         bias_V: torch.Tensor | None, tokens_N: torch.Tensor,
                         temperature: float = 1.0, chunk: int = 1024,
                         matmul_dtype: torch.dtype | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logp_N, entropy_N)`` of the chosen tokens under softmax((W·h + b) / τ), computed
    ``chunk`` positions at a time (see the module docstring); differentiable in ``hidden_ND``,
    ``W_VD`` and ``bias_V``.

    Args:
        hidden_ND: ``[N, D]`` final hidden states (what the output head reads).
        W_VD: ``[V, D]`` output head weight; ``bias_V``: ``[V]`` or None.
        tokens_N: ``[N]`` chosen token ids.
        temperature: τ > 0 (the sampler's temperature; greedy reads as 1).
        chunk: positions per chunk (>= 1); need not divide N.
        matmul_dtype: the dtype of the head's matmuls (forward and backward), e.g. bf16 as
            under ``--autocast bf16``, which the padded learner's head runs in; the logits
            are upcast before the softmax either way. None = float32 (float64 for a float64
            head).

    Returns:
        ``logp_N`` and ``entropy_N`` in float32 (float64 when the head is float64).
    """
    if hidden_ND.dim() != 2 or W_VD.dim() != 2 or hidden_ND.shape[1] != W_VD.shape[1]:
        raise ValueError(f"hidden_ND {tuple(hidden_ND.shape)} and W_VD {tuple(W_VD.shape)} "
                         "must be [N, D] and [V, D]")
    if tokens_N.shape != hidden_ND.shape[:1]:
        raise ValueError(f"tokens_N {tuple(tokens_N.shape)} must be [N] with N = "
                         f"{hidden_ND.shape[0]}")
    if chunk < 1:
        raise ValueError(f"chunk={chunk} must be >= 1")
    if not temperature > 0:
        raise ValueError(f"temperature={temperature} must be > 0")
    device_type = hidden_ND.device.type
    with torch.autocast(device_type, enabled=False):
        out: tuple[torch.Tensor, torch.Tensor] = _ChunkedLogpEntropy.apply(
            hidden_ND, W_VD, bias_V, tokens_N, float(temperature), int(chunk), matmul_dtype)
    return out
