"""The GPU profiling benchmarks: without a GPU they parse their options and stop with a
message instead of a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


@pytest.mark.parametrize(("new_tokens", "replays"), [(128, 32), (10, 8), (2, 0)])
def test_replays_after_a_prefill_stay_inside_the_cache(monkeypatch: pytest.MonkeyPatch,
                                                       new_tokens: int, replays: int) -> None:
    """`profile_engine.replay_after_prefill_us` replays the graphed step at most
    ``new_tokens - 2`` times after its prefill (the bucket's cache has no columns past
    that), and measures nothing when no replay fits or the step is not graphed."""
    pytest.importorskip("transformers")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import profile_engine
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
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
