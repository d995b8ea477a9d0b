"""The Triton kernels of `rlscope.sampling.backends.decode_attention` (imported on first
use: this module needs Triton, and ``TRITON_INTERPRET`` must be set before it is imported).
Triton resolves a kernel's calls to other jitted functions through module globals, hence a
module of their own."""


import triton
import triton.language as tl

try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # a Triton without PDL hooks: the kernels never launch with PDL there
    @triton.jit
    def gdc_wait():  # type: ignore[no-redef]
        pass

    @triton.jit
    def gdc_launch_dependents():  # type: ignore[no-redef]
        pass


@triton.jit
def attend_row(q, k_ptr, v_ptr, own, src, start, end, head, prompt_cols, stride_cb,
               stride_cl, BLOCK_G: tl.constexpr, BLOCK: tl.constexpr, D: tl.constexpr, scale):
    """``[BLOCK_G, D]`` float32 outputs of the queries ``q`` of cache row ``own`` (int64) at
    kv head offset ``head`` over its columns ``start .. end``, in blocks of ``BLOCK`` keys
    with an online softmax (running max, sum of exponentials and unnormalised output,
    float32).

    One loop over all the columns, each read from its own cache row: the prompt columns
    (below ``prompt_cols``) from row ``src`` (int64; the group's first row, whose prompt keys
    the other rows of the group share: one copy in L2 for the group), the rest from ``own``. A
    single loop is what Triton's pipeliner overlaps best: the next block's keys load while
    this one's products run, across the prompt/completion boundary (one H100, 104M shape:
    12.7 against 14.5 µs a layer for a loop per span)."""
    d = tl.arange(0, D)
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    s_sum = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, D], tl.float32)
    for first in range(start, end, BLOCK):
        cols = first + tl.arange(0, BLOCK)
        valid = cols < end
        rows = tl.where(cols < prompt_cols, src, own)
        place = rows[:, None] * stride_cb + head + cols[:, None] * stride_cl + d[None, :]
        k = tl.load(k_ptr + place, mask=valid[:, None], other=0.0)
        v = tl.load(v_ptr + place, mask=valid[:, None], other=0.0)  # both loads in flight
        s = (tl.dot(q, tl.trans(k)) * scale).to(tl.float32)  # scale may arrive as fp64
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        s_sum = s_sum * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
        m = m_new
    return acc / s_sum[:, None]


@triton.jit
def decode_attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, src_ptr, start_ptr, used_ptr,
                            prompt_cols, stride_qb, stride_qh, stride_cb, stride_cl, stride_ck,
                            stride_ob, stride_oh, scale,
                            GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
                            BLOCK: tl.constexpr, D: tl.constexpr):
    b = tl.program_id(0)
    kv = tl.program_id(1)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, D)
    rows = kv * GROUP + g
    live = (g < GROUP)[:, None]
    start = tl.load(start_ptr + b)
    end = start + tl.load(used_ptr + b)
    src = tl.load(src_ptr + b).to(tl.int64)  # int64 offsets: caches past 2**31 elements
    q = tl.load(q_ptr + b * stride_qb + rows[:, None] * stride_qh + d[None, :],
                mask=live, other=0.0)
    out = attend_row(q, k_ptr, v_ptr, b.to(tl.int64), src, start, end, kv * stride_ck,
                     prompt_cols, stride_cb, stride_cl, BLOCK_G, BLOCK, D, scale)
    tl.store(o_ptr + b * stride_ob + rows[:, None] * stride_oh + d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=live)


@triton.jit
def decode_attention_rope_kernel(qkv_ptr, cos_ptr, sin_ptr, rope_row_ptr, rope_rows, k_ptr,
                                 v_ptr, o_ptr, col_ptr,
                                 src_ptr, start_ptr, used_ptr, prompt_cols, stride_xb, stride_rb,
                                 stride_cb, stride_cl, stride_ck, stride_ob, stride_oh,
                                 scale, H: tl.constexpr, KV: tl.constexpr,
                                 GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
                                 BLOCK: tl.constexpr, D: tl.constexpr, PDL: tl.constexpr):
    """``PDL``: programmatic dependent launch (`rlscope.sampling.backends.layer_kernels`):
    the counters and the rotation are read before the wait (written two or more kernels
    earlier), the projections after it; the next kernel is released after the loop."""
    b = tl.program_id(0)
    kv = tl.program_id(1)
    # every scalar load first, so that none waits behind the rotation or the barrier
    start = tl.load(start_ptr + b)
    end = start + tl.load(used_ptr + b)
    src = tl.load(src_ptr + b).to(tl.int64)  # int64 offsets: caches past 2**31 elements
    col = tl.load(col_ptr)
    own = b.to(tl.int64)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, D)
    d_rolled = (d + D // 2) % D  # x.roll(D / 2)[d] = x[(d + D / 2) % D]
    row = qkv_ptr + b * stride_xb
    # this row's rotation: table row rope_row[b] (its position), kept inside the table
    r = tl.minimum(tl.maximum(tl.load(rope_row_ptr + b).to(tl.int64), 0), rope_rows - 1)
    cos = tl.load(cos_ptr + r * stride_rb + d)
    sin = tl.load(sin_ptr + r * stride_rb + d)  # first half negated (rotate_half)
    if PDL:
        gdc_wait()
    heads = kv * GROUP + g
    live = (g < GROUP)[:, None]
    q = tl.load(row + heads[:, None] * D + d[None, :], mask=live, other=0.0)
    q_r = tl.load(row + heads[:, None] * D + d_rolled[None, :], mask=live, other=0.0)
    q = (q * cos[None, :] + q_r * sin[None, :]).to(k_ptr.dtype.element_ty)
    k_new = tl.load(row + (H + kv) * D + d)
    k_r = tl.load(row + (H + kv) * D + d_rolled)
    k_new = (k_new * cos + k_r * sin).to(k_ptr.dtype.element_ty)
    v_new = tl.load(row + (H + KV + kv) * D + d)
    head = kv * stride_ck
    tl.store(k_ptr + own * stride_cb + head + col * stride_cl + d, k_new)
    tl.store(v_ptr + own * stride_cb + head + col * stride_cl + d,
             v_new.to(v_ptr.dtype.element_ty))
    tl.debug_barrier()  # the columns below include the one just written
    out = attend_row(q, k_ptr, v_ptr, own, src, start, end, head, prompt_cols, stride_cb,
                     stride_cl, BLOCK_G, BLOCK, D, scale)
    if PDL:
        gdc_launch_dependents()
    tl.store(o_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=live)
