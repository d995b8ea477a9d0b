"""`benchmarks/layer_chain.py` (the decode layer's products as cuBLAS or Triton kernel chains,
with and without programmatic dependent launch) on CPU: its kernels against torch in Triton's
interpreter, the shapes it builds, and the refusal to time without a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
pytest.importorskip("transformers")  # hf_engine's shapes
sys.path.insert(0, str(BENCHMARKS))
import layer_chain  # noqa: E402
from hf_engine import SHAPES  # noqa: E402

sys.path.remove(str(BENCHMARKS))


def test_kernels_equal_torch_in_the_interpreter() -> None:
    """``--check``: the product, split-K product, residual + norm and gate/up + SiLU kernels
    give torch's float32 results (several programs on every axis)."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, str(BENCHMARKS / "layer_chain.py"), "--check"],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout)
    assert res["device"] == "cpu"
    assert set(res["check"]) == {"matmul", "split_k", "add_norm_residual", "add_norm",
                                 "gate_up_silu"}
    for name, err in res["check"].items():
        assert 0 <= err < 1e-3, (name, err)


def test_layers_hold_the_shapes_of_the_model() -> None:
    """The 104M layer: q/k/v 1,280 outputs ((12 + 2 x 4) heads x 64), the MLP 3,072 wide, each
    product reading the one ahead's output."""
    net = layer_chain.Layers(SHAPES["104m"], rows=8, layers=2, split=4,
                             device=torch.device("cpu"), dtype=torch.float32)
    assert [net.dims(n) for n in ("qkv", "o", "gate_up", "down")] == \
        [(1280, 768), (768, 768), (3072, 768), (768, 3072)]
    assert net.w[0]["gate_up"].shape == (6144, 768) and net.parts.shape == (4, 8, 768)
    assert not torch.equal(net.w[0]["qkv"], net.w[1]["qkv"])  # each layer its own weights
    assert net.input("o").data_ptr() == net.out["qkv"].data_ptr()
    assert net.input("qkv") is net.out["down"] and net.input("down") is net.out["gate_up"]
    assert layer_chain.fits((64, 64, 64, 4, 3), 256, 1280, 768)
    assert not layer_chain.fits((64, 128, 64, 4, 3), 256, 1280, 768 // 4 + 1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_timing_without_a_gpu_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        layer_chain.main(["--rows", "0"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--rows must be >= 1 (got 0)" in err and "CUDA is not available here" in err
    assert "--check" in err  # says what to run instead
