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
import sys
from typing import Any

import torch

BLOCK_N = 32
"""Keys per block of the kernel's loop."""
NUM_WARPS = 1
"""Warps per program: one, since the kernel reads every column in one loop (one H100, the
compiled 104M sampler: 461.3k tokens/s against 454.0k with two warps; docs/performance.md)."""
_KERNELS: dict[str, Any] = {}


def available(head_dim: int) -> bool:
    """Whether the Triton kernel can run for this head dimension (Triton importable, Dh a
    power of two in [16, 256])."""
    return (importlib.util.find_spec("triton") is not None and 16 <= head_dim <= 256
            and head_dim & (head_dim - 1) == 0)


def _kernels() -> dict[str, Any]:
    """The Triton kernels (``plain``: `decode_attention`; ``rope``: `decode_attention_rope`),
    from `decode_kernels`, imported on first use (so ``TRITON_INTERPRET`` set by a test before
    the first call takes effect; `reset` forgets them)."""
    if not _KERNELS:
        from rlscope.sampling.backends import decode_kernels

        _KERNELS.update(plain=decode_kernels.decode_attention_kernel,
                        rope=decode_kernels.decode_attention_rope_kernel)
    return _KERNELS


def load() -> None:
    """Import the kernels now, before ``torch.compile`` traces a caller: imported lazily
    inside a compiled step, they change the step's guards (``_KERNELS`` no longer empty),
    and the step recompiles on its next call, which inside a CUDA graph capture fails."""
    _kernels()


def reset() -> None:
    """Forget the kernels (tests switching ``TRITON_INTERPRET``): the next call imports
    `decode_kernels` afresh."""
    _KERNELS.clear()
    sys.modules.pop("rlscope.sampling.backends.decode_kernels", None)


def launch_options(pdl: bool) -> dict[str, bool]:
    """The Triton launch option that makes a launch use programmatic dependent launch (none
    when ``pdl`` is off)."""
    return {"launch_pdl": True} if pdl else {}


def _own_rows(src_B: torch.Tensor | None, B: int, device: torch.device) -> torch.Tensor:
    """``src_B``, or every row reading its own prompt (int32 ``[B]``)."""
    if src_B is None:
        return torch.arange(B, dtype=torch.int32, device=device)
    if src_B.dtype != torch.int32 or src_B.shape != (B,):
        raise ValueError(f"src_B must be int32 [{B}], got {src_B.dtype} {tuple(src_B.shape)}")
    return src_B


def decode_attention(q_BHD: torch.Tensor, k_BLKD: torch.Tensor, v_BLKD: torch.Tensor,
                     start_B: torch.Tensor, used_B: torch.Tensor, scale: float,
                     src_B: torch.Tensor | None = None, prompt_cols: int = 0
                     ) -> torch.Tensor:
    """``[B, H, Dh]`` outputs of one query position per row over cache columns
    ``start_B[b] .. start_B[b] + used_B[b]`` (int32 ``[B]``) of ``[B, L, K, Dh]`` caches; query
    head ``h`` reads kv head ``h // (H / K)``. Graph-safe (no host reads).

    Shared prompts: columns below ``prompt_cols`` are read from cache row ``src_B[b]`` (int32;
    default: row ``b`` itself). The static sampler points every row of a group at the group's
    first row, so the rows of a group read one copy of their prompt's keys (from L2 after the
    first) instead of one copy each."""
    B, H, D = q_BHD.shape
    K = k_BLKD.shape[2]
    group = H // K
    if q_BHD.stride(-1) != 1 or k_BLKD.stride(-1) != 1 or k_BLKD.stride() != v_BLKD.stride():
        raise ValueError("decode_attention needs a contiguous last dimension and caches of "
                         "one layout")
    out_BHD = torch.empty_like(q_BHD)
    block_g = max(16, 1 << (group - 1).bit_length())
    src_B = _own_rows(src_B, B, q_BHD.device)
    _kernels()["plain"][(B, K)](q_BHD, k_BLKD, v_BLKD, out_BHD, src_B, start_B, used_B,
                                prompt_cols, q_BHD.stride(0), q_BHD.stride(1),
                                k_BLKD.stride(0), k_BLKD.stride(1), k_BLKD.stride(2),
                                out_BHD.stride(0), out_BHD.stride(1), scale,
                                GROUP=group, BLOCK_G=block_g, BLOCK=BLOCK_N, D=D,
                                num_warps=NUM_WARPS)
    return out_BHD


def decode_attention_rope(qkv_BX: torch.Tensor, cos_RD: torch.Tensor, sin_signed_RD: torch.Tensor,
                          k_BLKD: torch.Tensor, v_BLKD: torch.Tensor, col_1: torch.Tensor,
                          start_B: torch.Tensor, used_B: torch.Tensor, n_heads: int,
                          scale: float, src_B: torch.Tensor | None = None,
                          prompt_cols: int = 0, rope_row_B: torch.Tensor | None = None,
                          pdl: bool = False) -> torch.Tensor:
    """`decode_attention` with the steps before it in the same kernel: ``qkv_BX`` is the fused
    query/key/value projection of one position per row (``[B, (H + 2K)·Dh]``, unrotated); the
    kernel rotates the queries and the new key (``x·cos + x.roll(Dh/2)·sin'``, ``sin'`` with its
    first half negated, as `HFStaticWeights._qkv`, in float32 then cast to the cache dtype),
    writes the key and value to cache column ``col_1`` (a ``[1]`` device tensor), and attends
    over columns ``start_B[b] .. start_B[b] + used_B[b]``, which must include ``col_1``
    (``col_1 >= prompt_cols``; shared prompts through ``src_B`` as in `decode_attention`).

    The rotation of row ``b`` is row ``rope_row_B[b]`` (integer ``[B]``, e.g. the positions,
    clamped to the table) of the ``[R, Dh]`` tables ``cos_RD`` and ``sin_signed_RD``; without
    ``rope_row_B``, row ``b`` (tables of ``B`` rows, one per query row). Returns
    ``[B, H, Dh]``. Saves the rotation and the two cache writes as separate kernels (three
    launches per layer), and with a table of every position the rotation's own kernels.
    ``pdl``: launch with programmatic dependent launch (CUDA, compute capability 9.0 or
    later; `rlscope.sampling.backends.triton_layers`). The kernel then reads the counters,
    ``src_B``, ``rope_row_B`` and the tables before it waits for the kernel ahead, so they
    must have been written two or more kernels earlier: both must be given (a default would be
    made by the kernel just ahead). Graph-safe."""
    B = qkv_BX.shape[0]
    K, D = k_BLKD.shape[2], k_BLKD.shape[3]
    group = n_heads // K
    if pdl and (src_B is None or rope_row_B is None):
        raise ValueError("decode_attention_rope with pdl=True needs src_B and rope_row_B "
                         "(made before the kernel ahead, not defaulted here)")
    if qkv_BX.shape[1] != (n_heads + 2 * K) * D or qkv_BX.stride(1) != 1 \
            or cos_RD.stride(1) != 1 or sin_signed_RD.stride() != cos_RD.stride() \
            or cos_RD.shape != sin_signed_RD.shape or cos_RD.shape[1] != D \
            or k_BLKD.stride(-1) != 1 or k_BLKD.stride() != v_BLKD.stride():
        raise ValueError("decode_attention_rope needs [B, (H + 2K)·Dh] projections, [R, Dh] "
                         "rotation tables and caches of one layout, all contiguous in the "
                         "last dimension")
    if rope_row_B is None:
        if cos_RD.shape[0] != B:
            raise ValueError(f"without rope_row_B the rotation tables need one row per query "
                             f"row ({B}), got {cos_RD.shape[0]}")
        rope_row_B = torch.arange(B, dtype=torch.int32, device=qkv_BX.device)
    elif rope_row_B.shape != (B,) or rope_row_B.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"rope_row_B must be an integer [{B}] tensor, got {rope_row_B.dtype} "
                         f"{tuple(rope_row_B.shape)}")
    out_BHD = torch.empty(B, n_heads, D, dtype=k_BLKD.dtype, device=qkv_BX.device)
    block_g = max(16, 1 << (group - 1).bit_length())
    src_B = _own_rows(src_B, B, qkv_BX.device)
    _kernels()["rope"][(B, K)](qkv_BX, cos_RD, sin_signed_RD, rope_row_B, cos_RD.shape[0],
                               k_BLKD, v_BLKD, out_BHD, col_1, src_B, start_B, used_B,
                               prompt_cols, qkv_BX.stride(0), cos_RD.stride(0),
                               k_BLKD.stride(0), k_BLKD.stride(1), k_BLKD.stride(2),
                               out_BHD.stride(0), out_BHD.stride(1), scale, H=n_heads, KV=K,
                               GROUP=group, BLOCK_G=block_g, BLOCK=BLOCK_N, D=D, PDL=pdl,
                               num_warps=NUM_WARPS, **launch_options(pdl))
    return out_BHD
