"""The GPU profiling benchmarks: without a GPU they parse their options and stop with a
message instead of a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a GPU")
@pytest.mark.parametrize("script", ["profile_engine.py", "gemm_layouts.py"])
def test_gpu_profilers_refuse_cpu(script: str) -> None:
    path = ROOT / "benchmarks" / script
    run = subprocess.run([sys.executable, str(path), "--models", "tiny"], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode != 0
    assert "needs a CUDA device" in run.stderr and "Traceback" not in run.stderr


def _profile_engine() -> Any:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import profile_engine
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return profile_engine


@pytest.mark.parametrize(("new_tokens", "replays"), [(128, 32), (10, 8), (2, 0)])
def test_replays_after_a_prefill_stay_inside_the_cache(monkeypatch: pytest.MonkeyPatch,
                                                       new_tokens: int, replays: int) -> None:
    """`profile_engine.replay_after_prefill_us` replays the graphed step at most
    ``new_tokens - 2`` times after its prefill (the bucket's cache has no columns past
    that), and measures nothing when no replay fits or the step is not graphed."""
    pytest.importorskip("transformers")
    profile_engine = _profile_engine()
    from rlscope.sampling.backends import hf_static

    events: list[str] = []

    class Graph:
        def replay(self) -> None:
            events.append("replay")

    bucket = type("Bucket", (), {"graph": Graph()})()
    policy = torch.nn.Linear(1, 1)  # any weak-referenceable key of the decoders' table
    monkeypatch.setitem(hf_static._DECODERS, policy, (None, None, {"key": bucket}))
    monkeypatch.setattr(hf_static.HFStaticBackend, "_prefill",
                        staticmethod(lambda *a: events.append("prefill")))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    us = profile_engine.replay_after_prefill_us(policy, None, torch.zeros(1), torch.zeros(1),
                                                new_tokens)
    assert events == (["prefill"] + ["replay"] * replays if replays else [])
    assert (us is None) == (replays == 0)
    bucket.graph = None
    events.clear()
    assert profile_engine.replay_after_prefill_us(policy, None, torch.zeros(1),
                                                  torch.zeros(1), 128) is None
    assert events == []


def x(cat: str, name: str, ts: float, dur: float, corr: int | None = None) -> dict[str, Any]:
    """A Chrome-trace complete event (``ph: X``), with a correlation id when given."""
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur,
            **({"args": {"correlation": corr}} if corr is not None else {})}


def test_timeline_splits_a_call_into_busy_time_and_gaps() -> None:
    """`profile_engine.timeline_summary` on a hand-made trace: host 0–1,000 µs; a graph
    replay launched at 40 µs runs kernels at 100–150, 140–200 (overlapping: busy 100 µs, not
    110), 201–210 (a 1 µs gap) and 215–220 (5 µs); a kernel at 420–430 (200 µs, its launch
    began 30 µs after the gap opened); a copy at 900–950 (470 µs); a second replay, launched
    at 300 µs, at 960–990 (10 µs). A runtime call without a correlation id launches nothing
(the copy has none either), and an event without a start time is skipped. Every number
below is worked out by hand."""
    pytest.importorskip("transformers")
    pe = _profile_engine()

    events = [x("cpu_op", "generate", 0, 1000), x("cuda_runtime", "cudaGraphLaunch", 40, 5, 7),
              x("cuda_runtime", "cudaLaunchKernel", 250, 4, 8),
              x("cuda_runtime", "cudaGraphLaunch", 300, 5, 10),
              x("cuda_runtime", "cudaStreamSynchronize", 600, 1),  # no correlation id
              {"ph": "X", "cat": "kernel", "name": "no start time"},
              x("kernel", "gemm", 100, 50, 7), x("kernel", "attn", 140, 60, 7),
              x("kernel", "norm", 201, 9, 7), x("kernel", "silu", 215, 5, 7),
              x("kernel", "draw", 420, 10, 8), x("gpu_memcpy", "Memcpy DtoH", 900, 50, 9),
              x("kernel", "step", 960, 30, 10),
              {"ph": "i", "cat": "kernel", "name": "marker", "ts": 5}]
    out = pe.timeline_summary(events, top=2)
    assert out["host_ms"] == 1.0 and out["lead_ms"] == 0.1 and out["tail_ms"] == 0.01
    assert out["gpu_span_ms"] == 0.89 and out["kernels"] == 7
    assert out["gpu_busy_ms"] == 0.204  # 100 + 9 + 5 + 10 + 50 + 30 µs
    assert out["idle_by_gap_size"] == {"under_2us": {"count": 1, "ms": 0.001},
                                       "2_to_10us": {"count": 1, "ms": 0.005},
                                       "10_to_100us": {"count": 1, "ms": 0.01},
                                       "over_100us": {"count": 2, "ms": 0.67}}
    assert out["largest_gaps"] == [
        {"gap_us": 470.0, "at_ms": 0.43, "next_kernel": "Memcpy DtoH", "launched_by": None,
         "launch_after_gap_opened_us": None},
        {"gap_us": 200.0, "at_ms": 0.22, "next_kernel": "draw",
         "launched_by": "cudaLaunchKernel", "launch_after_gap_opened_us": 30.0}]
    assert out["graphs"] == {"replays": 2, "before_first_ms": 0.1, "first_ms": 0.12,
                             "rest_sum_ms": 0.03, "rest_median_us": 30.0, "rest_min_us": 30.0,
                             "rest_max_us": 30.0, "idle_between_ms": 0.74,
                             "after_last_ms": 0.01}
    assert out["replay_kinds"] == {}  # one decode replay: no line to fit
    assert "error" in pe.timeline_summary([x("cpu_op", "generate", 0, 10)])
    assert pe.graph_phases([], [], 0.0, 1.0) == {}


def test_replay_kinds_split_a_position_into_what_is_fixed_and_what_grows() -> None:
    """`profile_engine.replay_kinds` on a hand-made trace: a prefill replay (its kernels left
    out) and three decode replays launched out of order in the list, each with a product of
    5 µs and an attention of 10, 12 and 14 µs; a compiled kernel of 3 µs in the last replay
    only; a kernel without a correlation id (left out). The lines, by hand: attention 10 +
    2 per replay (mean 12); the product 5, flat; the compiled kernel (0, 0, 3): mean 1,
    slope 1.5, so -0.5 at the first replay."""
    pytest.importorskip("transformers")
    pe = _profile_engine()

    host = [x("cuda_runtime", "cudaGraphLaunch", ts, 1, corr)
            for ts, corr in ((30, 4), (0, 1), (20, 3), (10, 2))]
    gpu = [x("kernel", "prefill_gemm", 100, 50, 1), x("kernel", "decode_attention_rope", 200, 99)]
    for i, attn in ((2, 10), (3, 12), (4, 14)):
        gpu += [x("kernel", "nvjet_gemm", 100 * i, 5, i),
                x("kernel", "decode_attention_rope_kernel", 100 * i + 10, attn, i)]
    gpu.append(x("kernel", "triton_poi_fused_add", 450, 3, 4))
    assert pe.replay_kinds(gpu, host) == {
        "replays": 3, "attention": {"first_us": 10.0, "per_replay_us": 2.0, "mean_us": 12.0},
        "matmul": {"first_us": 5.0, "per_replay_us": 0.0, "mean_us": 5.0},
        "triton": {"first_us": -0.5, "per_replay_us": 1.5, "mean_us": 1.0}}
    assert pe.replay_kinds(gpu, host[:2]) == {}
