"""Where a Hugging Face model's decode position and learner step spend their GPU time.

Prints one JSON (also written to ``--output``): for each ``--models`` shape of
`hf_engine.SHAPES`,

- ``decode``: the static sampler's decode step (batch ``--batch``, ``--prompt_len`` prompt
  tokens in groups of ``--group``, ``--new_tokens`` new tokens): the graphed call's
  completion tokens/s, then the step run eagerly (and compiled, ``--compile``) under
  ``torch.profiler``: the GPU time per position by kernel, the top kernels and a split by
  kind (matmul, attention, Triton, other); and ``timeline``, where one whole call's wall
  time goes (`call_timeline`: the GPU's busy and idle time, the largest gaps, and the call
  cut at its CUDA graph replays into setup, prefill, decode positions and tail, and what in
  a decode position is fixed and what grows with it, by kernel kind: `replay_kinds`);
- ``learner`` (``--learner``): one packed learner step of `hf_engine.learner_section`'s
  ragged batch under the profiler, split the same way;
- ``attention``: the decode attention alone at the sampler's shapes, timed from CUDA graphs:
  the additive-mask SDPA the sampler uses, the same over only the written columns, and
  torch's flash kernel with per-row key lengths (``seqused_k``) where the build has it.

GPU only (the profiler's kernel times need CUDA)::

    python benchmarks/profile_engine.py --models 104m qwen0.5b --learner --output prof.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_engine import (
    SHAPES,
    add_sampler_switches,
    apply_sampler_switches,
    build_model,
    random_prompts,
    sampler_switch_errors,
)

from rlscope.policy.hf import HFPolicy
from rlscope.sampling import generate
from rlscope.sampling.backends import hf_static
from rlscope.sampling.draw import SamplingConfig


def log(msg: str) -> None:
    print(f"[profile_engine] {msg}", file=sys.stderr, flush=True)


KINDS = (("attention", ("fmha", "flash", "attention", "attn", "softmax")),
         ("matmul", ("gemm", "nvjet", "cutlass", "sm90_xmma", "cublas", "splitk")),
         ("triton", ("triton",)),
         ("copy", ("memcpy", "memset", "copy")))


def kind_of(name: str) -> str:
    low = name.lower()
    for kind, keys in KINDS:
        if any(k in low for k in keys):
            return kind
    return "other"


def profile_kernels(fn: Callable[[], None], calls: int) -> dict[str, Any]:
    """GPU kernel time of ``calls`` calls of ``fn`` per call: total, by kind, top kernels."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    per: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for evt in prof.events():
        if evt.device_type.name != "CUDA":
            continue
        per[evt.name][0] += evt.device_time_total / calls
        per[evt.name][1] += 1 / calls
    kinds: dict[str, float] = defaultdict(float)
    for name, (us, _) in per.items():
        kinds[kind_of(name)] += us
    top = sorted(per.items(), key=lambda kv: -kv[1][0])[:30]
    return {"gpu_us": sum(v[0] for v in per.values()),
            "kernels": sum(v[1] for v in per.values()),
            "by_kind_us": dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
            "top": [{"name": n[:120], "us": round(v[0], 2), "count": round(v[1], 2)}
                    for n, v in top]}


def _correlation(event: dict[str, Any]) -> Any:
    """A trace event's correlation id (a launch and the GPU work it queued share it), or
    None: events without one match nothing."""
    args = event.get("args")
    return args.get("correlation") if isinstance(args, dict) else None


def timeline_summary(events: list[dict[str, Any]], top: int = 12) -> dict[str, Any]:
    """Where one profiled call's wall time goes, from its Chrome-trace ``events``
    (``torch.profiler``'s ``export_chrome_trace``): the host span (every CPU operator and
    runtime call), the GPU span (first kernel's start to last kernel's end), the time the GPU
    is busy (the union of kernels and copies), the host time before the first kernel
    (``lead_ms``) and after the last (``tail_ms``), the idle time between kernels by gap size,
    and the ``top`` largest gaps with the kernel after each, the runtime call that launched it
    (matched by correlation id) and how long after the gap opened that call began (a gap the
    host opened: the launch came late), the call cut at its graph replays (`graph_phases`)
    and each decode replay's kernel time by kind (`replay_kinds`). Times in the trace are µs."""
    gpu = sorted((e for e in events if e.get("ph") == "X" and "ts" in e
                  and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                 key=lambda e: float(e["ts"]))
    host = [e for e in events if e.get("ph") == "X" and "ts" in e
            and e.get("cat") in ("cpu_op", "cuda_runtime")]
    if not gpu or not host:
        return {"error": "no GPU activity or no host operators in the trace"}
    launches = {_correlation(e): e for e in host
                if e.get("cat") == "cuda_runtime" and _correlation(e) is not None}
    h0 = min(float(e["ts"]) for e in host)
    h1 = max(float(e["ts"]) + float(e.get("dur", 0)) for e in host)
    g0 = float(gpu[0]["ts"])
    busy, end = 0.0, g0
    sizes = {"under_2us": [0, 0.0], "2_to_10us": [0, 0.0], "10_to_100us": [0, 0.0],
             "over_100us": [0, 0.0]}
    gaps: list[tuple[float, dict[str, Any]]] = []
    for e in gpu:
        ts, dur = float(e["ts"]), float(e.get("dur", 0))
        if ts > end:
            gap = ts - end
            label = "under_2us" if gap < 2 else "2_to_10us" if gap < 10 else \
                "10_to_100us" if gap < 100 else "over_100us"
            sizes[label][0] += 1
            sizes[label][1] += gap
            launch = launches.get(_correlation(e))
            gaps.append((gap, {"gap_us": round(gap, 1), "at_ms": round((end - h0) / 1e3, 3),
                               "next_kernel": str(e.get("name", ""))[:80],
                               "launched_by": str(launch.get("name", "")) if launch else None,
                               "launch_after_gap_opened_us":
                                   round(float(launch["ts"]) - end, 1) if launch else None}))
        busy += max(0.0, ts + dur - max(ts, end))
        end = max(end, ts + dur)
    gaps.sort(key=lambda g: -g[0])
    return {"host_ms": round((h1 - h0) / 1e3, 3), "gpu_span_ms": round((end - g0) / 1e3, 3),
            "gpu_busy_ms": round(busy / 1e3, 3), "lead_ms": round((g0 - h0) / 1e3, 3),
            "tail_ms": round((h1 - end) / 1e3, 3), "kernels": len(gpu),
            "idle_by_gap_size": {k: {"count": n, "ms": round(t / 1e3, 3)}
                                 for k, (n, t) in sizes.items()},
            "largest_gaps": [g for _, g in gaps[:top]],
            "graphs": graph_phases(gpu, host, h0, h1),
            "replay_kinds": replay_kinds(gpu, host)}


def _graph_launches(host: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[Any, int]]:
    """The host's CUDA graph launches in launch order, and each launch's index by its
    correlation id (the GPU work a replay queued carries its launch's id)."""
    launches = sorted((e for e in host if e.get("cat") == "cuda_runtime"
                       and e.get("name") == "cudaGraphLaunch"), key=lambda e: float(e["ts"]))
    return launches, {_correlation(e): i for i, e in enumerate(launches)
                      if _correlation(e) is not None}


def replay_kinds(gpu: list[dict[str, Any]], host: list[dict[str, Any]]) -> dict[str, Any]:
    """What is fixed in a decode position and what grows with it: the kernel time of each
    decode replay (every CUDA graph replay after the first: the static sampler's graphed
    prefill, or with ``--no_graph_prefill`` its first decode replay, which the line can
    spare) by kind (`kind_of`), and per kind a least-squares line through those times over
    the replay's index: ``first_us`` (the line at the first decode replay), ``per_replay_us``
    (its slope) and ``mean_us``. In the static sampler only the attention should grow (each position
    reads one more column of keys), so its slope times the replays is its cache read and its
    ``first_us`` what a layer's attention costs before any completion key (rotation, cache
    write, prompt span, launch and ramp). Needs two decode replays; empty otherwise."""
    launches, corr = _graph_launches(host)
    per: list[dict[str, float]] = [defaultdict(float) for _ in launches]
    for e in gpu:
        i = corr.get(_correlation(e))
        if i is not None and i > 0:
            per[i][kind_of(str(e.get("name", "")))] += float(e.get("dur", 0))
    per = per[1:]
    n = len(per)
    if n < 2:
        return {}
    x_mean = (n - 1) / 2
    x_var = sum((j - x_mean) ** 2 for j in range(n))
    out: dict[str, Any] = {"replays": n}
    for kind in sorted({k for times in per for k in times}):
        ys = [times.get(kind, 0.0) for times in per]
        y_mean = sum(ys) / n
        slope = sum((j - x_mean) * (y - y_mean) for j, y in enumerate(ys)) / x_var
        out[kind] = {"first_us": round(y_mean - slope * x_mean, 2),
                     "per_replay_us": round(slope, 4), "mean_us": round(y_mean, 2)}
    return out


def graph_phases(gpu: list[dict[str, Any]], host: list[dict[str, Any]], h0: float, h1: float
                 ) -> dict[str, Any]:
    """The call cut at its CUDA graph replays (``cudaGraphLaunch``, in launch order; the
    static sampler's first is its prefill, the rest its decode positions): each replay's GPU
    span (its first kernel's start to its last kernel's end, kernels matched to the launch by
    correlation id); the host-and-GPU time before the first replay's kernels start
    (``before_first_ms``: the call's setup), the first replay's span, the decode replays'
    spans (sum, median, min, max) and the idle time between consecutive replays, and the
    time after the last replay's kernels end (``after_last_ms``). Empty without replays."""
    launches, corr = _graph_launches(host)
    spans: list[list[float]] = [[float("inf"), float("-inf")] for _ in launches]
    for e in gpu:
        i = corr.get(_correlation(e))
        if i is not None:
            spans[i][0] = min(spans[i][0], float(e["ts"]))
            spans[i][1] = max(spans[i][1], float(e["ts"]) + float(e.get("dur", 0)))
    spans = [s for s in spans if s[0] <= s[1]]
    if not spans:
        return {}
    rest = [b - a for a, b in spans[1:]]
    idle = sum(max(0.0, spans[i + 1][0] - spans[i][1]) for i in range(len(spans) - 1))
    ordered = sorted(rest)
    return {"replays": len(spans), "before_first_ms": round((spans[0][0] - h0) / 1e3, 3),
            "first_ms": round((spans[0][1] - spans[0][0]) / 1e3, 3),
            "rest_sum_ms": round(sum(rest) / 1e3, 3),
            "rest_median_us": round(ordered[len(ordered) // 2], 1) if rest else None,
            "rest_min_us": round(ordered[0], 1) if rest else None,
            "rest_max_us": round(ordered[-1], 1) if rest else None,
            "idle_between_ms": round(idle / 1e3, 3),
            "after_last_ms": round((h1 - spans[-1][1]) / 1e3, 3)}


def call_timeline(fn: Callable[[], Any]) -> dict[str, Any]:
    """`timeline_summary` of one call of ``fn`` profiled with host and GPU activity (CUDA)."""
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text()).get("traceEvents", [])
    return timeline_summary(events)


def graph_time_us(fn: Callable[[], Any], iters: int = 50) -> float:
    """Mean µs of ``fn`` replayed from a CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e6


def call_phases(call: Callable[[], None], repeats: int) -> dict[str, Any]:
    """Where a whole sampler call's wall time goes: milliseconds per call in the prefill
    (with its draw; synchronised before and after) and in the rest (decode loop, output),
    and the host operators with the most CPU time in one call (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    plain = hf_static.HFStaticBackend._prefill
    spent = [0.0]

    def timed_prefill(*a: Any) -> None:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        plain(*a)
        torch.cuda.synchronize()
        spent[0] += time.perf_counter() - t0

    hf_static.HFStaticBackend._prefill = staticmethod(timed_prefill)  # type: ignore[method-assign]
    try:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(repeats):
            call()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / repeats
    finally:
        hf_static.HFStaticBackend._prefill = staticmethod(plain)  # type: ignore[method-assign]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        call()
        torch.cuda.synchronize()
    ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:15]
    return {"call_ms": wall * 1e3, "prefill_ms": spent[0] / repeats * 1e3,
            "rest_ms": (wall - spent[0] / repeats) * 1e3,
            "top_host_ops": [{"name": e.key[:80], "self_cpu_us": round(e.self_cpu_time_total),
                              "count": e.count} for e in ops]}


def decode_section(args: argparse.Namespace, shape: str, compiled: bool) -> dict[str, Any]:
    device = torch.device("cuda")
    model = build_model(shape).to(device)
    policy = HFPolicy(model)
    policy.autocast_dtype = torch.bfloat16
    policy.eval()
    cfg = SamplingConfig(temperature=1.0, stop_token_ids=(), backend="static",
                         compile_sampler=compiled)
    prompts = random_prompts(args.batch, args.prompt_len, SHAPES[shape]["vocab_size"], False, 0,
                             device, args.group)
    seeds_B = torch.arange(args.batch, device=device)
    group_B = torch.div(seeds_B, args.group, rounding_mode="floor")

    def call() -> None:
        generate(policy, prompts, cfg, seeds_B, args.new_tokens, group_id_B=group_B)

    for _ in range(2):
        call()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.repeats):
        call()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / args.repeats
    out: dict[str, Any] = {"graphed_tokens_per_s": args.batch * args.new_tokens / wall,
                           "graphed_ms_per_position": wall / args.new_tokens * 1e3}
    out["call"] = call_phases(call, args.repeats)
    out["timeline"] = call_timeline(call)
    out["graph_replay_us"] = replay_after_prefill_us(policy, prompts, seeds_B, group_B,
                                                     args.new_tokens)
    bucket = next(iter(hf_static._DECODERS[policy][2].values()))
    with torch.no_grad(), torch.autocast("cuda", enabled=False):
        hf_static.HFStaticBackend._prefill(bucket, prompts, seeds_B, group_B)
        out["profile"] = profile_kernels(bucket.step_fn, min(16, args.new_tokens - 2))
    torch.cuda.empty_cache()
    return out


def replay_after_prefill_us(policy: Any, prompts: Any, seeds_B: torch.Tensor,
                            group_B: torch.Tensor, new_tokens: int) -> float | None:
    """Mean µs of one graphed decode position of ``policy``'s (only) static-sampler bucket
    right after a prefill: ``min(32, new_tokens - 2)`` replays, so they stay inside the
    bucket's cache columns. None when the step is not graphed or no replay fits."""
    bucket = next(iter(hf_static._DECODERS[policy][2].values()))
    n = min(32, new_tokens - 2)
    if bucket.graph is None or n < 1:
        return None
    with torch.no_grad(), torch.autocast("cuda", enabled=False):
        hf_static.HFStaticBackend._prefill(bucket, prompts, seeds_B, group_B)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            bucket.graph.replay()
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def attention_section(args: argparse.Namespace, shape: str) -> dict[str, Any]:
    """The decode attention alone at position ``P + new_tokens / 2``."""
    s = SHAPES[shape]
    B, K = args.batch, s["num_key_value_heads"]
    H = s["num_attention_heads"]
    Dh = s["hidden_size"] // H
    G = H // K
    P = args.prompt_len
    L = P + args.new_tokens
    used = P + args.new_tokens // 2
    dev, dt = torch.device("cuda"), torch.bfloat16
    q_BKGD = torch.randn(B, K, G, Dh, device=dev, dtype=dt)
    k_BKLD = torch.randn(B, K, L, Dh, device=dev, dtype=dt)
    v_BKLD = torch.randn_like(k_BKLD)
    bias_BK1L = torch.full((B, K, 1, L), float("-inf"), device=dev, dtype=dt)
    bias_BK1L[..., :used] = 0
    out: dict[str, Any] = {"rows": B, "keys": L, "used": used}
    out["sdpa_bias_full_us"] = graph_time_us(lambda: F.scaled_dot_product_attention(
        q_BKGD, k_BKLD, v_BKLD, attn_mask=bias_BK1L))
    ub = -(-used // 32) * 32
    out["sdpa_bias_sliced_us"] = graph_time_us(lambda: F.scaled_dot_product_attention(
        q_BKGD, k_BKLD[:, :, :ub], v_BKLD[:, :, :ub], attn_mask=bias_BK1L[..., :ub]))
    out["sdpa_sliced_nomask_us"] = graph_time_us(lambda: F.scaled_dot_product_attention(
        q_BKGD, k_BKLD[:, :, :used], v_BKLD[:, :, :used]))

    def manual() -> torch.Tensor:
        s_BKGL = torch.matmul(q_BKGD, k_BKLD.transpose(-1, -2)) + bias_BK1L
        return torch.matmul(s_BKGL.float().softmax(-1).to(dt), v_BKLD)

    out["manual_full_us"] = graph_time_us(manual)
    # torch's flash kernel, rows of L keys, each using its first `used` (a [B, L, K, D] cache)
    k_BLKD = k_BKLD.transpose(1, 2).contiguous()
    v_BLKD = v_BKLD.transpose(1, 2).contiguous()
    q_BHD = torch.randn(B, H, Dh, device=dev, dtype=dt)
    cu_q = torch.arange(B + 1, device=dev, dtype=torch.int32)
    cu_k = torch.arange(B + 1, device=dev, dtype=torch.int32) * L
    seqused = torch.full((B,), used, device=dev, dtype=torch.int32)
    try:
        def flash() -> Any:
            return torch.ops.aten._flash_attention_forward(
                q_BHD, k_BLKD.view(B * L, K, Dh), v_BLKD.view(B * L, K, Dh), cu_q, cu_k, 1, L,
                0.0, False, False, seqused_k=seqused)

        out["flash_seqused_us"] = graph_time_us(flash)
    except Exception as exc:
        out["flash_seqused_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    try:
        q_B1HD = q_BHD[:, None]

        def flash_dense() -> Any:
            return torch.ops.aten._flash_attention_forward(
                q_B1HD, k_BLKD, v_BLKD, None, None, 1, L, 0.0, False, False)

        out["flash_dense_full_us"] = graph_time_us(flash_dense)
    except Exception as exc:
        out["flash_dense_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    out["triton"] = triton_sweep(args, q_BHD, k_BLKD, v_BLKD, used)
    return out


def triton_sweep(args: argparse.Namespace, q_BHD: torch.Tensor, k_BLKD: torch.Tensor,
                 v_BLKD: torch.Tensor, used: int, layers: int = 12) -> dict[str, float]:
    """µs per call of the Triton decode kernels by keys per block and warps per program:
    `decode_attention` with every row reading its own prompt copy or the rows of a group of
    ``--group`` reading one, and `decode_attention_rope` (what the sampler runs: rotation,
    cache writes, shared prompt). Each graph calls the kernel on ``layers`` caches in turn, as
    a decode position does, so that the caches come from memory rather than from L2 (a
    kernel timed on one cache reads it from L2 and looks ~20% faster than it runs)."""
    from rlscope.sampling.backends import decode_attention

    if not decode_attention.available(q_BHD.shape[-1]):
        return {}
    B, H, D = q_BHD.shape
    K, dev = k_BLKD.shape[2], q_BHD.device
    start_B = torch.zeros(B, dtype=torch.int32, device=dev)
    used_B = torch.full((B,), used, dtype=torch.int32, device=dev)
    own_B = torch.arange(B, dtype=torch.int32, device=dev)
    group_B = torch.div(own_B, args.group, rounding_mode="floor") * args.group
    qkv_BX = torch.randn(B, (H + 2 * K) * D, device=dev, dtype=q_BHD.dtype)
    angle_BD = torch.rand(B, D, device=dev)
    cos_BD, sin_BD = angle_BD.cos(), angle_BD.sin()
    col_1 = torch.full((1,), used - 1, dtype=torch.long, device=dev)
    caches = [(k_BLKD.clone(), v_BLKD.clone()) for _ in range(layers)]

    def plain(src_B: torch.Tensor) -> None:
        for k, v in caches:
            decode_attention.decode_attention(q_BHD, k, v, start_B, used_B, 0.125, src_B,
                                              args.prompt_len)

    def rope() -> None:
        for k, v in caches:
            decode_attention.decode_attention_rope(qkv_BX, cos_BD, sin_BD, k, v, col_1,
                                                   start_B, used_B, H, 0.125, group_B,
                                                   args.prompt_len)

    res: dict[str, float] = {}
    saved = (decode_attention.BLOCK_N, decode_attention.NUM_WARPS)
    try:
        for block in (16, 32, 64):
            for warps in (1, 2, 4):
                decode_attention.BLOCK_N, decode_attention.NUM_WARPS = block, warps
                for label, fn in (("own", partial(plain, own_B)),
                                  ("shared", partial(plain, group_B)), ("rope", rope)):
                    res[f"block{block}/warps{warps}/{label}"] = round(
                        graph_time_us(fn, iters=20) / layers, 2)
    finally:
        decode_attention.BLOCK_N, decode_attention.NUM_WARPS = saved
    return res


def eager_time_us(fn: Callable[[], Any], iters: int = 20) -> float:
    """Mean µs of ``fn`` run eagerly (after 3 warm-up calls)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e6


def learner_attention_section(shape: str, tokens: int = 6144) -> dict[str, Any]:
    """Forward + backward of the learner's attention over ``tokens`` packed tokens of rows of
    64..384 tokens: SDPA over bins of 384 with a block-diagonal causal mask (the packed
    learner's SDPA path), SDPA causal over padded rows of 384, and torch's varlen flash kernel
    over one sequence."""
    s = SHAPES[shape]
    H, K = s["num_attention_heads"], s["num_key_value_heads"]
    Dh = s["hidden_size"] // H
    dev, dt = torch.device("cuda"), torch.bfloat16
    g = torch.Generator().manual_seed(0)
    lengths: list[int] = []
    while sum(lengths) < tokens:
        lengths.append(int(torch.randint(64, 385, (1,), generator=g)))
    lengths[-1] -= sum(lengths) - tokens
    out: dict[str, Any] = {"tokens": tokens, "rows": len(lengths)}
    bins = -(-tokens // 384)
    qb = torch.randn(bins, H, 384, Dh, device=dev, dtype=dt, requires_grad=True)
    kb = torch.randn(bins, K, 384, Dh, device=dev, dtype=dt, requires_grad=True)
    vb = torch.randn(bins, K, 384, Dh, device=dev, dtype=dt, requires_grad=True)
    seg = torch.zeros(bins * 384, dtype=torch.long)
    start = 0
    for i, n in enumerate(lengths):
        seg[start:start + n] = i
        start += n
    seg_b = seg.view(bins, 384).to(dev)
    causal = torch.ones(384, 384, dtype=torch.bool, device=dev).tril()
    mask = (seg_b[:, :, None] == seg_b[:, None, :]) & causal
    mask = mask[:, None]

    def sdpa_mask() -> None:
        o = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, enable_gqa=True)
        o.sum().backward()

    def sdpa_causal() -> None:
        o = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, enable_gqa=True)
        o.sum().backward()

    out["sdpa_blockmask_fwd_bwd_us"] = eager_time_us(sdpa_mask)
    out["sdpa_causal_fwd_bwd_us"] = eager_time_us(sdpa_causal)
    try:
        from torch.nn.attention.varlen import varlen_attn

        q = torch.randn(tokens, H, Dh, device=dev, dtype=dt, requires_grad=True)
        k = torch.randn(tokens, K, Dh, device=dev, dtype=dt, requires_grad=True)
        v = torch.randn(tokens, K, Dh, device=dev, dtype=dt, requires_grad=True)
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device=dev,
                          dtype=torch.int32)

        def varlen() -> None:
            o = varlen_attn(q, k, v, cu, cu, max(lengths), max(lengths), is_causal=True)
            o.sum().backward()

        out["varlen_fwd_bwd_us"] = eager_time_us(varlen)
    except Exception as exc:
        out["varlen_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    return out


def host_profile(fn: Callable[[], None]) -> dict[str, Any]:
    """The host side of one call of ``fn``: the top operators by self CPU time, and the
    synchronising runtime calls."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    avg = prof.key_averages()
    cpu = sorted(avg, key=lambda e: -e.self_cpu_time_total)[:30]
    syncs = {e.key: e.count for e in avg
             if any(k in e.key for k in ("Synchronize", "MemcpyAsync", "cudaMemcpy", "item",
                                         "_local_scalar_dense", "nonzero"))}
    return {"wall_profiled_s": wall,
            "top_cpu": [{"name": e.key[:100], "self_cpu_ms": round(e.self_cpu_time_total / 1e3, 2),
                         "count": e.count} for e in cpu],
            "sync_calls": syncs}


def learner_profile(args: argparse.Namespace, shape: str, tmp: Path) -> dict[str, Any]:
    from hf_engine import learner_config, ragged_batch, save_model

    from rlscope.config import (
        MethodConfig,
        ModelConfig,
        OptimConfig,
        RunConfig,
        TaskConfig,
        TrainConfig,
    )
    from rlscope.learner import prepare
    from rlscope.train import setup

    device = torch.device("cuda")
    model_dir = tmp / shape
    params = save_model(shape, model_dir)
    batch = ragged_batch(256, 32, 64, 384, SHAPES[shape]["vocab_size"], 8, device)
    real = int(batch.completion_mask_BT.sum()) + batch.prompt_tokens_BP.numel()
    out: dict[str, Any] = {"params": params, "real_tokens": real}
    for label, overrides in args.learner_variants:
        cfg = TrainConfig(
            method="grpo", task="length_target",
            task_options=TaskConfig(length_limit=384, eval_batches=1, eval_batch_size=8),
            components=MethodConfig(selection="none", kl_coef=0.0),
            model=ModelConfig(arch="hf", path=str(model_dir), autocast="bf16"),
            optim=OptimConfig(lr=1e-5, grad_clip=1.0),
            run=RunConfig(num_steps=1, batch_size=256, group_size=8, micro_batch_size=16,
                          eval_every=0, device="cuda", progress=False, runs_dir=str(tmp),
                          log_samples=0, doctor_every=0, name=f"prof_{label}"))
        cfg, used = learner_config(cfg, True, 16 * 384, False, overrides)
        parts = setup(cfg)
        parts.policy.train()
        inputs, _ = prepare(parts.spec, batch, parts.policy, None, None, 0.0,
                            parts.d.group_size, parts.plan.dist)
        for _ in range(2):
            parts.learn(batch, inputs, 0.0, None)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        for _ in range(3):
            parts.learn(batch, inputs, 0.0, None)
        torch.cuda.synchronize()
        step = (time.perf_counter() - t0) / 3
        row = {"config": used, "step_s": step, "tokens_per_s": real / step,
               "peak_memory_gb": torch.cuda.max_memory_allocated() / 2**30,
               "mfu": 6 * params * real / step / 989e12,
               "profile": profile_kernels(partial(parts.learn, batch, inputs, 0.0, None), 1),
               "host": host_profile(partial(parts.learn, batch, inputs, 0.0, None))}
        log(f"learner {label}: {row['tokens_per_s']:,.0f} tokens/s, mfu {row['mfu']:.3f}")
        out[label] = row
        del parts, inputs
        torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["104m", "qwen0.5b"], choices=list(SHAPES),
                   help="model shapes (hf_engine.SHAPES)")
    p.add_argument("--batch", type=int, default=256, help="sampler rows")
    p.add_argument("--prompt_len", type=int, default=64, help="prompt tokens")
    p.add_argument("--group", type=int, default=8, help="rows sharing a prompt")
    p.add_argument("--new_tokens", type=int, default=128, help="new tokens per row")
    p.add_argument("--repeats", type=int, default=3, help="timed sampler calls")
    p.add_argument("--compile", action="store_true", help="also profile --compile_sampler")
    p.add_argument("--learner", action="store_true", help="also profile a packed learner step")
    p.add_argument("--learner_model", default="qwen0.5b", choices=list(SHAPES),
                   help="the shape whose learner step --learner profiles")
    p.add_argument("--learner_variant", action="append", default=[], metavar="LABEL:K=V,..",
                   help="extra learner variants (LearnerConfig overrides)")
    p.add_argument("--compile_mode", default=None,
                   help="torch.compile mode of the compiled decode step (hf_static.COMPILE_MODE)")
    add_sampler_switches(p)
    p.add_argument("--skip_attention", action="store_true", help="no attention microbenchmarks")
    p.add_argument("--skip_decode", action="store_true", help="only attention and learner")
    p.add_argument("--output", default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    errors = sampler_switch_errors(args)
    if errors:
        p.error("; ".join(errors))
    if not torch.cuda.is_available():
        raise SystemExit(f"{Path(__file__).name} profiles GPU kernels: it needs a CUDA device")
    variants: list[tuple[str, dict[str, Any]]] = [("packed", {})]
    for item in args.learner_variant:
        label, _, rest = item.partition(":")
        kv = {}
        for pair in filter(None, rest.split(",")):
            k, _, v = pair.partition("=")
            try:
                kv[k] = json.loads(v)
            except json.JSONDecodeError:
                kv[k] = v
        variants.append((label, kv))
    args.learner_variants = variants
    hf_static.COMPILE_MODE = args.compile_mode
    apply_sampler_switches(args)
    import tempfile

    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "args": {k: v for k, v in vars(args).items()
                                    if k != "learner_variants"}}
    res["flash_forward_schema"] = str(torch.ops.aten._flash_attention_forward.default._schema)
    res["torch_varlen"] = importlib.util.find_spec("torch.nn.attention.varlen") is not None
    for shape in args.models:
        r: dict[str, Any] = {}
        if not args.skip_attention:
            log(f"{shape}: attention")
            r["attention"] = attention_section(args, shape)
            r["learner_attention"] = learner_attention_section(shape)
        if not args.skip_decode:
            log(f"{shape}: decode")
            r["decode"] = decode_section(args, shape, False)
            if args.compile:
                log(f"{shape}: decode compiled")
                r["decode_compiled"] = decode_section(args, shape, True)
        res[shape] = r
        if args.output:
            Path(args.output).write_text(json.dumps(res, indent=1))
    if args.learner:
        with tempfile.TemporaryDirectory() as tmp:
            res["learner"] = learner_profile(args, args.learner_model, Path(tmp))
    emit(res, args.output)
    return res


def emit(res: dict[str, Any], output: str | None) -> None:
    """Print the JSON, and write it to ``output`` when given."""
    text = json.dumps(res, indent=1)
    print(text)
    if output:
        Path(output).write_text(text)


if __name__ == "__main__":
    main()
