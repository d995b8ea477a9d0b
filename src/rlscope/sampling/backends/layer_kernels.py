"""The Triton kernels of `rlscope.sampling.backends.triton_layers` (imported on first use: this
module needs Triton, and ``TRITON_INTERPRET`` must be set before it is imported).

Each kernel may be launched with programmatic dependent launch (PDL, Hopper and later): with
``PDL`` set it calls ``gdc_wait`` before its first read of another kernel's output or its first
write, and ``gdc_launch_dependents`` once its main loop is done, so the next kernel's programs
are scheduled while this one's finish. Reads of buffers written two or more kernels earlier
may come before the wait: when a PDL kernel starts, the kernel ahead of it has passed its own
wait, so every earlier kernel has finished.

The products read their operands through host-made TMA tensor descriptors
(``triton.tools.tensor_descriptor.TensorDescriptor``): on one H100 the split-K down projection
of the 104M shape (256 × 768 × 3,072, four float32 slices) took 6.0 µs this way against
8.5–10.8 µs with pointer loads, and 5.65 µs in cuBLAS (docs/performance.md, twelfth session).
A descriptor's block may run past the tensor's edge (TMA fills zeros); a product's slices of
the input dimension must be whole blocks, which the host checks.
"""

import triton
import triton.language as tl

from rlscope.sampling.backends.decode_kernels import gdc_launch_dependents, gdc_wait
from rlscope.sampling.backends.gate_up_kernels import silu_product


@triton.jit
def add_norm_kernel(x_ptr, parts_ptr, bias_ptr, g_ptr, h_ptr, M, eps, N: tl.constexpr,
                    S: tl.constexpr, HAS_BIAS: tl.constexpr, ROWS: tl.constexpr,
                    BN: tl.constexpr, PDL: tl.constexpr):
    """The residual stream plus a split-K product, then RMSNorm: for ``S`` > 0,
    ``x += (Σ_s parts[s]) (+ bias)`` in float32 over the ``S`` slices in order, written back;
    then ``h = x · rsqrt(mean(x²) + eps) · g`` in float32, rounded to ``h``'s dtype (the
    arithmetic of ``F.rms_norm`` on a float32 ``x``). ``ROWS`` rows a program; ``BN`` a power
    of two >= ``N``."""
    rm = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rn = tl.arange(0, BN)
    ok = (rm < M)[:, None] & (rn < N)[None, :]
    place = rm.to(tl.int64)[:, None] * N + rn[None, :]
    g = tl.load(g_ptr + rn, mask=rn < N, other=0.0)
    if PDL:
        gdc_wait()
    x = tl.load(x_ptr + place, mask=ok, other=0.0)
    if S > 0:
        part = tl.load(parts_ptr + place, mask=ok, other=0.0)
        for s in tl.static_range(1, S):
            part += tl.load(parts_ptr + s * M * N + place, mask=ok, other=0.0)
        if HAS_BIAS:
            part += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        x += part
        tl.store(x_ptr + place, x, mask=ok)
    if PDL:
        gdc_launch_dependents()
    r = tl.rsqrt(tl.sum(x * x, 1) / N + eps)
    tl.store(h_ptr + place, (x * r[:, None] * g[None, :]).to(h_ptr.dtype.element_ty), mask=ok)


@triton.jit
def tile_product(a_desc, w_desc, m0, n0, k_start, k_end, BM: tl.constexpr, BN: tl.constexpr,
                 BK: tl.constexpr, STAGES: tl.constexpr):
    """The float32 ``[BM, BN]`` tile ``a[m0:, k_start:k_end] @ w[n0:, k_start:k_end].T`` in
    ``BK``-wide steps, ``STAGES`` of them in flight (inlined: the same code as written in
    place)."""
    acc = tl.zeros([BM, BN], tl.float32)
    for k0 in tl.range(k_start, k_end, BK, num_stages=STAGES):
        acc = tl.dot(a_desc.load([m0, k0]), w_desc.load([n0, k0]).T, acc)
    return acc


@triton.jit
def linear_kernel(a_desc, w_desc, bias_ptr, c_ptr, M, N, K, stride_c,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr,
                  HAS_BIAS: tl.constexpr, PDL: tl.constexpr):
    """``c = a @ w.T (+ bias)`` (``[M, K] x [N, K]``): float32 accumulation, the bias added in
    float32, rounded once to ``c``'s dtype (as cuBLAS's bias epilogue under ``F.linear``).
    Program axis 0 walks the rows, so neighbouring programs share a weight tile."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if PDL:
        gdc_wait()
    acc = tile_product(a_desc, w_desc, pid_m * BM, pid_n * BN, 0, K, BM, BN, BK, STAGES)
    if PDL:
        gdc_launch_dependents()
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    tl.store(c_ptr + rm.to(tl.int64)[:, None] * stride_c + rn[None, :],
             acc.to(c_ptr.dtype.element_ty), mask=(rm < M)[:, None] & (rn < N)[None, :])


@triton.jit
def split_k_kernel(a_desc, w_desc, parts_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr,
                   BK: tl.constexpr, S: tl.constexpr, STAGES: tl.constexpr,
                   PDL: tl.constexpr):
    """``parts[s] = a[:, Ks] @ w[:, Ks].T`` in float32 for the ``S`` equal slices ``Ks`` of the
    input dimension (each a whole number of ``BK`` blocks; ``parts``: contiguous
    ``[S, M, N]``; program axis 2 is the slice): the partial products that
    `rlscope.sampling.backends.hf_static.split_k_linear` makes with one cuBLAS batched
    product, summed by `add_norm_kernel`."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    s = tl.program_id(2)
    width = K // S
    if PDL:
        gdc_wait()
    acc = tile_product(a_desc, w_desc, pid_m * BM, pid_n * BN, s * width, (s + 1) * width, BM,
                       BN, BK, STAGES)
    if PDL:
        gdc_launch_dependents()
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    tl.store(parts_ptr + s * M * N + rm.to(tl.int64)[:, None] * N + rn[None, :], acc,
             mask=(rm < M)[:, None] & (rn < N)[None, :])


@triton.jit
def gate_up_silu_kernel(x_desc, w_desc, out_ptr, M, N, K, stride_o,
                        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                        STAGES: tl.constexpr, PDL: tl.constexpr):
    """One ``[BM, BN]`` tile of ``silu(x @ w[:N].T) * (x @ w[N:2N].T)`` with the rounding of
    `rlscope.sampling.backends.gate_up_kernels.silu_product`, its operands read through TMA
    descriptors (``w_desc``: the fused ``[2N, K]`` weight)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if PDL:
        gdc_wait()
    gate = tl.zeros([BM, BN], tl.float32)
    up = tl.zeros([BM, BN], tl.float32)
    for k0 in tl.range(0, K, BK, num_stages=STAGES):
        x = x_desc.load([pid_m * BM, k0])
        gate = tl.dot(x, w_desc.load([pid_n * BN, k0]).T, gate)
        up = tl.dot(x, w_desc.load([N + pid_n * BN, k0]).T, up)
    if PDL:
        gdc_launch_dependents()
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    tl.store(out_ptr + rm.to(tl.int64)[:, None] * stride_o + rn[None, :],
             silu_product(gate, up, out_ptr.dtype.element_ty),
             mask=(rm < M)[:, None] & (rn < N)[None, :])
