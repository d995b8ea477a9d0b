"""The Triton kernel of `rlscope.sampling.backends.gate_up` (imported on first use: this
module needs Triton, and ``TRITON_INTERPRET`` must be set before it is imported)."""

import triton
import triton.language as tl


@triton.jit
def silu_product(gate, up, dtype: tl.constexpr):
    """``silu(gate) * up`` from float32 products, rounded as the unfused steps round them:
    each product to ``dtype`` (as `F.linear` returns it), the SiLU in float32 then rounded,
    times ``up``, rounded (``F.silu(gate).mul_(up)``)."""
    g = gate.to(dtype).to(tl.float32)
    silu = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
    return (silu * up.to(dtype).to(tl.float32)).to(dtype)


@triton.jit
def gate_up_silu_kernel(x_ptr, w_ptr, out_ptr, M, N, K, stride_x, stride_w, stride_o,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One ``[BLOCK_M, BLOCK_N]`` tile of ``silu(x @ w[:N].T) * (x @ w[N:2N].T)``: the gate
    and up products of the same columns accumulate side by side in float32, each is rounded to
    ``w``'s dtype as `F.linear` rounds it, and the SiLU and the product are rounded as
    ``F.silu(gate).mul_(up)`` rounds them."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    pid_m = pid % num_m  # neighbouring programs share a weight tile (it stays in L2)
    pid_n = pid // num_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    x_rows = x_ptr + rm.to(tl.int64)[:, None] * stride_x
    gate_rows = w_ptr + rn.to(tl.int64)[:, None] * stride_w
    up_rows = gate_rows + N * stride_w
    gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + rk) < K
        x = tl.load(x_rows + (k0 + rk)[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w_mask = n_ok[:, None] & k_ok[None, :]
        w_gate = tl.load(gate_rows + (k0 + rk)[None, :], mask=w_mask, other=0.0)
        w_up = tl.load(up_rows + (k0 + rk)[None, :], mask=w_mask, other=0.0)
        gate = tl.dot(x, tl.trans(w_gate), gate)
        up = tl.dot(x, tl.trans(w_up), up)
    y = silu_product(gate, up, w_ptr.dtype.element_ty)
    tl.store(out_ptr + rm.to(tl.int64)[:, None] * stride_o + rn[None, :], y,
             mask=m_ok[:, None] & n_ok[None, :])
