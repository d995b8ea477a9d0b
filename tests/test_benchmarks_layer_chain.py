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
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": "",
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
    """The 104M layer: q/k/v 1,280 outputs ((12 + 2 x 4) heads x 64), the gate/up product
    2 x 3,072 wide, each product reading the one ahead's output; which tiles fit."""
    net = layer_chain.Layers(SHAPES["104m"], rows=64, layers=2, split=4,
                             device=torch.device("cpu"), dtype=torch.float32)
    assert [net.dims(n) for n in layer_chain.PRODUCTS] == \
        [(1280, 768), (768, 768), (6144, 768), (768, 3072)]
    assert net.w[0]["gate_up"].shape == (6144, 768) and net.parts.shape == (4, 64, 768)
    assert not torch.equal(net.w[0]["qkv"], net.w[1]["qkv"])  # each layer its own weights
    assert net.input("o").data_ptr() == net.out["qkv"].data_ptr()
    assert net.input("down").data_ptr() == net.out["gate_up"].data_ptr()
    assert net.input("down").shape == (64, 3072) and net.input("qkv") is net.out["down"]
    assert layer_chain.fits((64, 64, 64, 4, 3), 256, 1280, 768)
    assert not layer_chain.fits((64, 64, 128, 4, 3), 256, 768, 192)  # 192-wide slices
    assert not layer_chain.fits((128, 64, 64, 4, 3), 64, 1280, 768)  # 64 rows < 128
    # the 104M shape: every product has a tile, the slices of 4 are multiples of 64
    assert all(layer_chain.fitting(net, n) for n in layer_chain.PRODUCTS)
    assert layer_chain.shape_errors(net, ["layer", "down_sweep"]) == []


def test_shapes_no_tile_fits_are_refused_saying_what_to_change() -> None:
    """Rows off the tiles, and the 0.5B shape's 896-wide input in 4 slices (224 columns each,
    not a multiple of 64), are refused before anything is timed."""
    cpu = torch.device("cpu")
    rows = layer_chain.Layers(SHAPES["104m"], 100, 1, 4, cpu, torch.float32)
    assert layer_chain.shape_errors(rows, ["chain"]) == \
        ["--rows must be a multiple of 64 (the tiles' rows; got 100)"]
    qwen = layer_chain.Layers(SHAPES["qwen0.5b"], 64, 1, 4, cpu, torch.float32)
    errors = layer_chain.shape_errors(qwen, ["layer"])
    assert len(errors) == 1 and "--split 4" in errors[0] and "divides 14" in errors[0]
    assert layer_chain.shape_errors(qwen, ["chain"]) == []  # no slices in the chain
    assert layer_chain.shape_errors(
        layer_chain.Layers(SHAPES["qwen0.5b"], 64, 1, 2, cpu, torch.float32), ["layer"]) == []


def test_pdl_hooks_and_the_prefetch_compile_for_hopper() -> None:
    """Each kernel compiled ahead of time for sm_90 (no GPU needed): with ``PDL`` its PTX waits
    on the grid ahead and releases the next one; without, neither; the prefetch asks L2."""
    pytest.importorskip("triton")
    import triton
    from triton.backends.compiler import GPUTarget

    sys.path.insert(0, str(BENCHMARKS))
    import layer_chain_kernels as k

    sys.path.remove(str(BENCHMARKS))
    ints = ("M", "N", "K", "stride_a", "stride_w", "stride_c", "stride_x", "stride_o")

    def ptx(fn: object, ptrs: dict[str, str], **const: object) -> str:
        names = fn.arg_names  # type: ignore[attr-defined]
        sig = {n: ptrs.get(n, "i32" if n in ints else "fp32" if n == "eps" else "constexpr")
               for n in names}
        src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=const)
        try:
            return str(triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"])
        except RuntimeError as exc:  # a Triton build without the CUDA toolchain
            pytest.skip(f"cannot compile for sm_90 here: {exc}")

    bf16 = {"a_ptr": "*bf16", "w_ptr": "*bf16", "c_ptr": "*bf16"}
    tile = {"BM": 64, "BN": 64, "BK": 64}
    codes = {
        "matmul": ptx(k.matmul_kernel, bf16, **tile, PDL=True, EARLY=False, PREFETCH=True,
                      LINES=16),
        "split_k": ptx(k.split_k_kernel, {**bf16, "c_ptr": "*fp32"}, **tile, S=4, PDL=True),
        "gate_up_silu": ptx(k.gate_up_silu_kernel, {"x_ptr": "*bf16", "w_ptr": "*bf16",
                                                    "out_ptr": "*bf16"}, **tile, PDL=True),
    }
    for name, code in codes.items():
        assert "griddepcontrol.wait" in code and "griddepcontrol.launch_dependents" in code, name
    assert "prefetch.global.L2" in codes["matmul"]
    plain = ptx(k.matmul_kernel, bf16, **tile, PDL=False, EARLY=False, PREFETCH=False, LINES=16)
    assert "griddepcontrol" not in plain and "prefetch.global.L2" not in plain


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_timing_without_a_gpu_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        layer_chain.main(["--rows", "0"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--rows must be >= 1 (got 0)" in err and "CUDA is not available here" in err
    assert "--check" in err  # says what to run instead
