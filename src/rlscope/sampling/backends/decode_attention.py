"""Decode attention for the static sampler: one query position per row over its written keys,
as one Triton kernel.

At decode time each row attends with one position of ``H`` query heads to its own span of
a ``[B, L, K, Dh]`` key/value cache: columns ``start_B[b] .. start_B[b] + used_B[b]``.
General attention kernels are a poor fit for this shape: torch's flash kernel tiles 128 query
rows per block where a kv head has ``group = H / K`` of them (7 for Qwen2.5-0.5B), and the
fused SDPA kernels read the whole cache under an additive mask. Measured on one H100
(``benchmarks/profile_engine.py``), a layer's decode attention at batch 256 cost 18–31 µs on
either, for a cache of 17–34 MB.

`decode_attention` runs one program per (row, kv head): it loads the ``group`` query rows of
that kv head once (padded to 16 rows, the smallest ``tl.dot``), walks the row's written keys
in blocks of `BLOCK_N` with an online softmax in float32, and writes the ``group`` outputs.
Only written keys are read; no mask exists. The arithmetic is flash attention's (float32
scores and running max/sum, probabilities cast to the cache dtype for the value product), so
results agree with the flash kernel to bf16 rounding.

Valid regime: CUDA (or Triton's CPU interpreter, ``TRITON_INTERPRET=1``, which the tests
use), a head dimension that is a power of two from 16 to 256, at least one key per row.
`available` says whether Triton is importable; the static sampler falls back to torch's flash
kernel otherwise (`rlscope.sampling.backends.hf_static.DecodeKeys`).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

BLOCK_N = 64
"""Keys per block of the kernel's loop."""
_KERNEL: list[Any] = []


def available(head_dim: int) -> bool:
    """Whether the Triton kernel can run for this head dimension (Triton importable, Dh a
    power of two in [16, 256])."""
    return (importlib.util.find_spec("triton") is not None and 16 <= head_dim <= 256
            and head_dim & (head_dim - 1) == 0)


def _kernel() -> Any:
    """The Triton kernel, defined on first use (so ``TRITON_INTERPRET`` set by a test before
    the first call takes effect; `reset` forgets it)."""
    if _KERNEL:
        return _KERNEL[0]
    import triton
    import triton.language as tl

    @triton.jit
    def decode_attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, start_ptr, used_ptr,
                                stride_qb, stride_qh, stride_cb, stride_cl, stride_ck,
                                stride_ob, stride_oh, scale,
                                GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
                                BLOCK: tl.constexpr, D: tl.constexpr):
        b = tl.program_id(0)
        kv = tl.program_id(1)
        start = tl.load(start_ptr + b)
        n = tl.load(used_ptr + b)
        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, D)
        rows = kv * GROUP + g
        q = tl.load(q_ptr + b * stride_qb + rows[:, None] * stride_qh + d[None, :],
                    mask=(g < GROUP)[:, None], other=0.0)
        m = tl.full([BLOCK_G], float("-inf"), tl.float32)
        s_sum = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, D], tl.float32)
        k_base = k_ptr + b * stride_cb + kv * stride_ck
        v_base = v_ptr + b * stride_cb + kv * stride_ck
        for off in range(0, n, BLOCK):
            cols = off + tl.arange(0, BLOCK)
            valid = cols < n
            place = (start + cols)[:, None] * stride_cl + d[None, :]
            k = tl.load(k_base + place, mask=valid[:, None], other=0.0)
            s = (tl.dot(q, tl.trans(k)) * scale).to(tl.float32)  # scale may arrive as fp64
            s = tl.where(valid[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            alpha = tl.exp(m - m_new)
            p = tl.exp(s - m_new[:, None])
            s_sum = s_sum * alpha + tl.sum(p, 1)
            v = tl.load(v_base + place, mask=valid[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
            m = m_new
        out = acc / s_sum[:, None]
        tl.store(o_ptr + b * stride_ob + rows[:, None] * stride_oh + d[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=(g < GROUP)[:, None])

    _KERNEL.append(decode_attention_kernel)
    return decode_attention_kernel


_ROPE_KERNEL: list[Any] = []


def _rope_kernel() -> Any:
    """The kernel of `decode_attention_rope`, defined on first use (as `_kernel`)."""
    if _ROPE_KERNEL:
        return _ROPE_KERNEL[0]
    import triton
    import triton.language as tl

    @triton.jit
    def decode_attention_rope_kernel(qkv_ptr, cos_ptr, sin_ptr, k_ptr, v_ptr, o_ptr, col_ptr,
                                     start_ptr, used_ptr, stride_xb, stride_rb,
                                     stride_cb, stride_cl, stride_ck, stride_ob, stride_oh,
                                     scale, H: tl.constexpr, KV: tl.constexpr,
                                     GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
                                     BLOCK: tl.constexpr, D: tl.constexpr):
        b = tl.program_id(0)
        kv = tl.program_id(1)
        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, D)
        d_rolled = (d + D // 2) % D  # x.roll(D / 2)[d] = x[(d + D / 2) % D]
        row = qkv_ptr + b * stride_xb
        cos = tl.load(cos_ptr + b * stride_rb + d)
        sin = tl.load(sin_ptr + b * stride_rb + d)  # first half negated (rotate_half)
        heads = kv * GROUP + g
        live = (g < GROUP)[:, None]
        q = tl.load(row + heads[:, None] * D + d[None, :], mask=live, other=0.0)
        q_r = tl.load(row + heads[:, None] * D + d_rolled[None, :], mask=live, other=0.0)
        q = (q * cos[None, :] + q_r * sin[None, :]).to(k_ptr.dtype.element_ty)
        k_new = tl.load(row + (H + kv) * D + d)
        k_r = tl.load(row + (H + kv) * D + d_rolled)
        k_new = (k_new * cos + k_r * sin).to(k_ptr.dtype.element_ty)
        v_new = tl.load(row + (H + KV + kv) * D + d)
        col = tl.load(col_ptr)
        k_base = k_ptr + b * stride_cb + kv * stride_ck
        v_base = v_ptr + b * stride_cb + kv * stride_ck
        tl.store(k_base + col * stride_cl + d, k_new)
        tl.store(v_base + col * stride_cl + d, v_new.to(v_ptr.dtype.element_ty))
        tl.debug_barrier()  # the loop below reads the column just written
        start = tl.load(start_ptr + b)
        n = tl.load(used_ptr + b)
        m = tl.full([BLOCK_G], float("-inf"), tl.float32)
        s_sum = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, D], tl.float32)
        for off in range(0, n, BLOCK):
            cols = off + tl.arange(0, BLOCK)
            valid = cols < n
            place = (start + cols)[:, None] * stride_cl + d[None, :]
            k = tl.load(k_base + place, mask=valid[:, None], other=0.0)
            s = (tl.dot(q, tl.trans(k)) * scale).to(tl.float32)
            s = tl.where(valid[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            alpha = tl.exp(m - m_new)
            p = tl.exp(s - m_new[:, None])
            s_sum = s_sum * alpha + tl.sum(p, 1)
            v = tl.load(v_base + place, mask=valid[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
            m = m_new
        out = acc / s_sum[:, None]
        tl.store(o_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=live)

    _ROPE_KERNEL.append(decode_attention_rope_kernel)
    return decode_attention_rope_kernel


def reset() -> None:
    """Forget the defined kernels (tests switching ``TRITON_INTERPRET``)."""
    _KERNEL.clear()
    _ROPE_KERNEL.clear()


def decode_attention(q_BHD: torch.Tensor, k_BLKD: torch.Tensor, v_BLKD: torch.Tensor,
                     start_B: torch.Tensor, used_B: torch.Tensor, scale: float
                     ) -> torch.Tensor:
    """``[B, H, Dh]`` outputs of one query position per row over cache columns
    ``start_B[b] .. start_B[b] + used_B[b]`` (int32 ``[B]``) of ``[B, L, K, Dh]`` caches; query
    head ``h`` reads kv head ``h // (H / K)``. Graph-safe (no host reads)."""
    B, H, D = q_BHD.shape
    K = k_BLKD.shape[2]
    group = H // K
    if q_BHD.stride(-1) != 1 or k_BLKD.stride(-1) != 1 or k_BLKD.stride() != v_BLKD.stride():
        raise ValueError("decode_attention needs a contiguous last dimension and caches of "
                         "one layout")
    out_BHD = torch.empty_like(q_BHD)
    block_g = max(16, 1 << (group - 1).bit_length())
    _kernel()[(B, K)](q_BHD, k_BLKD, v_BLKD, out_BHD, start_B, used_B,
                      q_BHD.stride(0), q_BHD.stride(1), k_BLKD.stride(0), k_BLKD.stride(1),
                      k_BLKD.stride(2), out_BHD.stride(0), out_BHD.stride(1), scale,
                      GROUP=group, BLOCK_G=block_g, BLOCK=BLOCK_N, D=D)
    return out_BHD


def decode_attention_rope(qkv_BX: torch.Tensor, cos_BD: torch.Tensor, sin_signed_BD: torch.Tensor,
                          k_BLKD: torch.Tensor, v_BLKD: torch.Tensor, col_1: torch.Tensor,
                          start_B: torch.Tensor, used_B: torch.Tensor, n_heads: int,
                          scale: float) -> torch.Tensor:
    """`decode_attention` with the steps before it in the same kernel: ``qkv_BX`` is the fused
    query/key/value projection of one position per row (``[B, (H + 2K)·Dh]``, unrotated); the
    kernel rotates the queries and the new key (``x·cos + x.roll(Dh/2)·sin'``, ``sin'`` with its
    first half negated, as `HFStaticWeights._qkv`, in float32 then cast to the cache dtype),
    writes the key and value to cache column ``col_1`` (a ``[1]`` device tensor), and attends
    over columns ``start_B[b] .. start_B[b] + used_B[b]``, which must include ``col_1``.
    Returns ``[B, H, Dh]``. Saves the rotation and the two cache writes as separate kernels
    (three launches per layer). Graph-safe."""
    B = qkv_BX.shape[0]
    K, D = k_BLKD.shape[2], k_BLKD.shape[3]
    group = n_heads // K
    if qkv_BX.shape[1] != (n_heads + 2 * K) * D or qkv_BX.stride(1) != 1 \
            or cos_BD.stride(1) != 1 or sin_signed_BD.stride() != cos_BD.stride() \
            or k_BLKD.stride(-1) != 1 or k_BLKD.stride() != v_BLKD.stride():
        raise ValueError("decode_attention_rope needs [B, (H + 2K)·Dh] projections, [B, Dh] "
                         "rotations and caches of one layout, all contiguous in the last "
                         "dimension")
    out_BHD = torch.empty(B, n_heads, D, dtype=k_BLKD.dtype, device=qkv_BX.device)
    block_g = max(16, 1 << (group - 1).bit_length())
    _rope_kernel()[(B, K)](qkv_BX, cos_BD, sin_signed_BD, k_BLKD, v_BLKD, out_BHD, col_1,
                           start_B, used_B, qkv_BX.stride(0), cos_BD.stride(0),
                           k_BLKD.stride(0), k_BLKD.stride(1), k_BLKD.stride(2),
                           out_BHD.stride(0), out_BHD.stride(1), scale, H=n_heads, KV=K,
                           GROUP=group, BLOCK_G=block_g, BLOCK=BLOCK_N, D=D)
    return out_BHD
