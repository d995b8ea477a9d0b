"""The Triton kernels of `rlscope.sampling.backends.decode_attention` (imported on first
use: this module needs Triton, and ``TRITON_INTERPRET`` must be set before it is imported).
Triton resolves a kernel's calls to other jitted functions through module globals, hence a
module of their own."""


import triton
import triton.language as tl


@triton.jit
def attend_span(q, k_base, v_base, start, n, stride_cl, m, s_sum, acc,
                BLOCK: tl.constexpr, D: tl.constexpr, scale):
    """The online-softmax state ``(m, s_sum, acc)`` (running max, sum of exponentials and
    unnormalised ``[BLOCK_G, D]`` output, float32) of the queries ``q`` advanced over cache
    columns ``start .. start + n``, in blocks of ``BLOCK`` keys."""
    d = tl.arange(0, D)
    for off in range(0, n, BLOCK):
        cols = off + tl.arange(0, BLOCK)
        valid = cols < n
        place = (start + cols)[:, None] * stride_cl + d[None, :]
        k = tl.load(k_base + place, mask=valid[:, None], other=0.0)
        v = tl.load(v_base + place, mask=valid[:, None], other=0.0)  # both loads in flight
        s = (tl.dot(q, tl.trans(k)) * scale).to(tl.float32)  # scale may arrive as fp64
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        s_sum = s_sum * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
        m = m_new
    return m, s_sum, acc


@triton.jit
def attend_row(q, k_ptr, v_ptr, b, kv, src_ptr, start_ptr, used_ptr, prompt_cols,
               stride_cb, stride_cl, stride_ck, BLOCK_G: tl.constexpr, BLOCK: tl.constexpr,
               D: tl.constexpr, scale):
    """``[BLOCK_G, D]`` float32 outputs of row ``b``'s queries ``q`` of kv head ``kv``: its
    prompt columns ``start .. prompt_cols`` read from row ``src[b]`` (the group's first row,
    whose prompt keys the other rows of the group share: one copy in L2 for the group), then
    its own columns ``prompt_cols .. start + used``."""
    start = tl.load(start_ptr + b)
    end = start + tl.load(used_ptr + b)
    src = tl.load(src_ptr + b).to(tl.int64)  # int64 offsets: caches past 2**31 elements
    own = b.to(tl.int64)
    head = kv * stride_ck
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    s_sum = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, D], tl.float32)
    split = tl.minimum(tl.maximum(prompt_cols, start), end)
    m, s_sum, acc = attend_span(q, k_ptr + src * stride_cb + head,
                                v_ptr + src * stride_cb + head, start, split - start,
                                stride_cl, m, s_sum, acc, BLOCK, D, scale)
    m, s_sum, acc = attend_span(q, k_ptr + own * stride_cb + head, v_ptr + own * stride_cb + head,
                                split, end - split, stride_cl, m, s_sum, acc, BLOCK, D, scale)
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
    q = tl.load(q_ptr + b * stride_qb + rows[:, None] * stride_qh + d[None, :],
                mask=live, other=0.0)
    out = attend_row(q, k_ptr, v_ptr, b, kv, src_ptr, start_ptr, used_ptr, prompt_cols,
                     stride_cb, stride_cl, stride_ck, BLOCK_G, BLOCK, D, scale)
    tl.store(o_ptr + b * stride_ob + rows[:, None] * stride_oh + d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=live)

@triton.jit
def decode_attention_rope_kernel(qkv_ptr, cos_ptr, sin_ptr, rope_row_ptr, rope_rows, k_ptr,
                                 v_ptr, o_ptr, col_ptr,
                                 src_ptr, start_ptr, used_ptr, prompt_cols, stride_xb, stride_rb,
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
    # this row's rotation: table row rope_row[b] (its position), kept inside the table
    r = tl.minimum(tl.maximum(tl.load(rope_row_ptr + b).to(tl.int64), 0), rope_rows - 1)
    cos = tl.load(cos_ptr + r * stride_rb + d)
    sin = tl.load(sin_ptr + r * stride_rb + d)  # first half negated (rotate_half)
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
    k_base = k_ptr + b.to(tl.int64) * stride_cb + kv * stride_ck
    v_base = v_ptr + b.to(tl.int64) * stride_cb + kv * stride_ck
    tl.store(k_base + col * stride_cl + d, k_new)
    tl.store(v_base + col * stride_cl + d, v_new.to(v_ptr.dtype.element_ty))
    tl.debug_barrier()  # the span below includes the column just written
    out = attend_row(q, k_ptr, v_ptr, b, kv, src_ptr, start_ptr, used_ptr, prompt_cols,
                     stride_cb, stride_cl, stride_ck, BLOCK_G, BLOCK, D, scale)
    tl.store(o_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=live)
