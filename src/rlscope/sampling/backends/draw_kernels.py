"""The Triton kernels of `rlscope.sampling.backends.fused_draw` (imported on first use: this
module needs Triton, and ``TRITON_INTERPRET`` must be set before it is imported)."""

import triton
import triton.language as tl

M1 = tl.constexpr(0xFF51AFD7ED558CCD - (1 << 64))
"""`rlscope.sampling.processors`' hash constants (as signed int64)."""
M2 = tl.constexpr(0xC4CEB9FE1A85EC53 - (1 << 64))
GOLDEN = tl.constexpr(0x9E3779B97F4A7C15 - (1 << 64))
LOW31 = tl.constexpr((1 << 31) - 1)


@triton.jit
def fmix64(x):
    """MurmurHash3's 64-bit finaliser on int64, as `processors._fmix64` (logical shifts
    emulated by masking, products wrapping)."""
    x = x ^ ((x >> 33) & LOW31)
    x = x * M1
    x = x ^ ((x >> 33) & LOW31)
    x = x * M2
    return x ^ ((x >> 33) & LOW31)


@triton.jit
def chunk_stats_kernel(logits_ptr, stats_ptr, V, stride_b, temperature_ptr, CHUNK: tl.constexpr,
                       BLOCK: tl.constexpr, RAW: tl.constexpr):
    """Per (row, chunk of ``CHUNK`` columns): the max and the sum of exponentials (shifted by
    that max) of ``logits / temperature``, and with ``RAW`` of the logits themselves;
    ``stats[b, c] = (m, s, m_raw, s_raw)``."""
    b = tl.program_id(0)
    c = tl.program_id(1)
    temperature = tl.load(temperature_ptr)  # a float32 tensor: compiled callers pass floats as fp64
    row = logits_ptr + b.to(tl.int64) * stride_b  # B·V may pass 2**31
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    m1 = tl.full([BLOCK], float("-inf"), tl.float32)
    s1 = tl.zeros([BLOCK], tl.float32)
    for off in range(c * CHUNK, tl.minimum(c * CHUNK + CHUNK, V), BLOCK):
        cols = off + tl.arange(0, BLOCK)
        live = cols < V
        x = tl.load(row + cols, mask=live, other=float("-inf")).to(tl.float32)
        xt = x / temperature
        m_new = tl.maximum(m, xt)
        s = s * tl.exp(m - m_new) + tl.where(live, tl.exp(xt - m_new), 0.0)
        s = tl.where(m_new == float("-inf"), 0.0, s)
        m = m_new
        if RAW:
            m1_new = tl.maximum(m1, x)
            s1 = s1 * tl.exp(m1 - m1_new) + tl.where(live, tl.exp(x - m1_new), 0.0)
            s1 = tl.where(m1_new == float("-inf"), 0.0, s1)
            m1 = m1_new
    mm = tl.max(m, 0)
    ss = tl.sum(tl.where(m == float("-inf"), 0.0, s * tl.exp(m - mm)), 0)
    out = stats_ptr + (b * tl.num_programs(1) + c) * 4
    tl.store(out, mm)
    tl.store(out + 1, ss)
    if RAW:
        mm1 = tl.max(m1, 0)
        ss1 = tl.sum(tl.where(m1 == float("-inf"), 0.0, s1 * tl.exp(m1 - mm1)), 0)
        tl.store(out + 2, mm1)
        tl.store(out + 3, ss1)


@triton.jit
def chunk_draw_kernel(logits_ptr, norm_ptr, hash_ptr, best_ptr, index_ptr, ent_ptr, p2_ptr,
                      V, stride_b, temperature_ptr, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
                      RAW: tl.constexpr, ENTROPY: tl.constexpr, SUM_P2: tl.constexpr):
    """Per (row, chunk): the largest ``logp - log(-log u)`` over the chunk and its first
    column (the Gumbel-max draw's candidate), ``logp = (x/T - max) - log(sum)`` with the row's
    ``norm[b] = (max, log sum, max_raw, log sum_raw)``; ``u`` the counter-based uniform of
    `processors.uniform_noise_at` from the row's hash ``hash[b]``; with ``ENTROPY`` the chunk's
    ``Σ p_raw · logp_raw``, with ``SUM_P2`` its ``Σ p²``."""
    b = tl.program_id(0)
    c = tl.program_id(1)
    temperature = tl.load(temperature_ptr)  # a float32 tensor: compiled callers pass floats as fp64
    row = logits_ptr + b.to(tl.int64) * stride_b  # B·V may pass 2**31
    mx = tl.load(norm_ptr + b * 4)
    lse = tl.load(norm_ptr + b * 4 + 1)
    mx1 = tl.load(norm_ptr + b * 4 + 2)
    lse1 = tl.load(norm_ptr + b * 4 + 3)
    h = tl.load(hash_ptr + b)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    where = tl.full([BLOCK], 2147483647, tl.int32)
    ent = tl.zeros([BLOCK], tl.float32)
    p2 = tl.zeros([BLOCK], tl.float32)
    for off in range(c * CHUNK, tl.minimum(c * CHUNK + CHUNK, V), BLOCK):
        cols = off + tl.arange(0, BLOCK)
        live = cols < V
        x = tl.load(row + cols, mask=live, other=float("-inf")).to(tl.float32)
        logp = (x / temperature - mx) - lse
        bits = (fmix64(h + cols.to(tl.int64) * GOLDEN) >> 40) & 16777215
        u = (bits.to(tl.float32) + 0.5) / 16777216.0
        score = logp - tl.log(-tl.log(u))  # as inductor writes it: bit-equal to torch
        score = tl.where(live, score, float("-inf"))
        better = (score > best) | ((score == best) & (cols < where))
        best = tl.where(better, score, best)
        where = tl.where(better, cols, where)
        if ENTROPY:
            logp1 = (x - mx1) - lse1 if RAW else logp
            ent += tl.where(live & (logp1 > float("-inf")), tl.exp(logp1) * logp1, 0.0)
        if SUM_P2:
            p = tl.where(live, tl.exp(logp), 0.0)
            p2 += p * p
    top = tl.max(best, 0)
    first = tl.min(tl.where(best == top, where, 2147483647), 0)
    i = b * tl.num_programs(1) + c
    tl.store(best_ptr + i, top)
    tl.store(index_ptr + i, first)
    if ENTROPY:
        tl.store(ent_ptr + i, tl.sum(ent, 0))
    if SUM_P2:
        tl.store(p2_ptr + i, tl.sum(p2, 0))
