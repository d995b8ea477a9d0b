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
