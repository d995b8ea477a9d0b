"""The Triton kernels of `layer_chain` (imported on first use: ``TRITON_INTERPRET`` must be set
before this module is imported). Benchmark kernels, not the sampler's: plain tiles without
masks (every dimension a multiple of its block), each with optional hooks for programmatic
dependent launch (PDL): ``gdc_wait`` before the first read of another kernel's output, and
``gdc_launch_dependents`` where the next kernel may start."""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from rlscope.sampling.backends.gate_up_kernels import silu_product


@triton.jit
def prefetch_l2(ptrs):
    """Ask L2 for the 128-byte line at each pointer (``prefetch.global.L2``); returns zeros, to
    be consumed so the request is kept."""
    return tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs],
                                     dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def matmul_kernel(a_ptr, w_ptr, c_ptr, M, N, K, stride_a, stride_w, stride_c,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PDL: tl.constexpr,
                  EARLY: tl.constexpr, PREFETCH: tl.constexpr, LINES: tl.constexpr):
    """``c = a @ w.T`` (``[M, K] x [N, K]``, float32 accumulation, ``c``'s dtype out).

    ``PDL``: wait for the kernel ahead before reading ``a``; release the next kernel at the
    start (``EARLY``) or after the loop. ``PREFETCH`` (with ``PDL``): before the wait, ask L2
    for the program's whole weight tile (``LINES``: a power of two >= ``K / 64``)."""
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    if PREFETCH:
        lines = tl.minimum(tl.arange(0, LINES), K // 64 - 1)  # 64 half-precision = 128 bytes
        sink = prefetch_l2(w_ptr + rn[:, None] * stride_w + lines[None, :] * 64)
    if PDL:
        if EARLY:
            gdc_launch_dependents()
        gdc_wait()
    acc = tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * stride_a + (k0 + rk)[None, :])
        w = tl.load(w_ptr + rn[:, None] * stride_w + (k0 + rk)[None, :])
        acc = tl.dot(a, tl.trans(w), acc)
    if PDL and not EARLY:
        gdc_launch_dependents()
    out = c_ptr + rm[:, None] * stride_c + rn[None, :]
    if PREFETCH:  # never true (rows are >= 0): consumes the prefetches' results
        keep = (tl.sum(sink, 1) != 0)[None, :] & (rm < 0)[:, None]
        tl.store(out, acc.to(c_ptr.dtype.element_ty), mask=~keep)
    else:
        tl.store(out, acc.to(c_ptr.dtype.element_ty))


@triton.jit
def split_k_kernel(a_ptr, w_ptr, c_ptr, M, N, K, stride_a, stride_w,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, S: tl.constexpr,
                   PDL: tl.constexpr):
    """``c[s] = a[:, Ks] @ w[:, Ks].T`` in float32 for the ``S`` equal slices ``Ks`` of the input
    dimension (``c``: ``[S, M, N]``; program axis 2 is the slice), the partial products the
    sampler's `split_k_linear` makes with one cuBLAS batched product. ``PDL``: wait before the
    loop, release the next kernel after it."""
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    s = tl.program_id(2)
    rk = tl.arange(0, BK)
    width = K // S
    if PDL:
        gdc_wait()
    acc = tl.zeros([BM, BN], tl.float32)
    for k0 in range(s * width, (s + 1) * width, BK):
        a = tl.load(a_ptr + rm[:, None] * stride_a + (k0 + rk)[None, :])
        w = tl.load(w_ptr + rn[:, None] * stride_w + (k0 + rk)[None, :])
        acc = tl.dot(a, tl.trans(w), acc)
    if PDL:
        gdc_launch_dependents()
    tl.store(c_ptr + s * M * N + rm[:, None] * N + rn[None, :], acc)


@triton.jit
def gate_up_silu_kernel(x_ptr, w_ptr, out_ptr, M, N, K, stride_x, stride_w, stride_o,
                        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                        PDL: tl.constexpr):
    """``silu(x @ w[:N].T) * (x @ w[N:].T)`` with the sampler's rounding
    (`rlscope.sampling.backends.gate_up_kernels.silu_product`), without masks, plus the ``PDL``
    hooks: the sampler's pointer-load kernel as last session's tables measured it (the
    sampler's PDL kernel, `layer_kernels.gate_up_silu_kernel`, reads through TMA)."""
    pid = tl.program_id(0)
    num_m = M // BM
    rm = (pid % num_m) * BM + tl.arange(0, BM)
    rn = (pid // num_m) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    if PDL:
        gdc_wait()
    gate = tl.zeros([BM, BN], tl.float32)
    up = tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, K, BK):
        x = tl.load(x_ptr + rm[:, None] * stride_x + (k0 + rk)[None, :])
        w_rows = w_ptr + rn[:, None] * stride_w + (k0 + rk)[None, :]
        gate = tl.dot(x, tl.trans(tl.load(w_rows)), gate)
        up = tl.dot(x, tl.trans(tl.load(w_rows + N * stride_w)), up)
    if PDL:
        gdc_launch_dependents()
    tl.store(out_ptr + rm[:, None] * stride_o + rn[None, :],
             silu_product(gate, up, w_ptr.dtype.element_ty))
