"""The gated MLP's gate/up product and its SiLU product as one Triton kernel, for the static
sampler's decode step.

A Qwen2/Llama MLP block computes ``silu(h @ W_gate.T) * (h @ W_up.T)``. The static sampler
holds the two weights as one ``[2I, D]`` matrix, so the decode step ran one cuBLAS product and
then the SiLU product as a kernel of its own (eagerly, two). At 256 rows both are
latency-bound: on one H100 at the 104M shape (D 768, I 3,072), 7.7 µs for the product and
9.7 µs for the two (compiled), against 9.5 µs for `gate_up_silu`, whose programs accumulate
the gate and up columns of one tile side by side and apply the SiLU product before storing.
In the 104M sampler (``benchmarks/sampler_ab.py``, docs/performance.md): compiled 457.2k →
461.2k tokens/s, graphed without compiling 310.2k → 340.7k.

The arithmetic is that of the unfused steps: float32 accumulation, the gate and up products
rounded to the weight's dtype, the SiLU (float32) and the product rounded as
``F.silu(gate).mul_(up)`` rounds them; only the order of the products' additions differs
from cuBLAS's. Valid regime: CUDA with Triton and a half-precision weight (or Triton's CPU
interpreter in tests, `ON_CPU`), ``x`` and the weight contiguous in their last dimension.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

import torch

TILE: tuple[int, int, int, int, int] = (64, 32, 64, 4, 4)
"""``(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)``: the fastest of the 64 tiles tried
(``benchmarks/gemm_layouts.py --gate_up_tiles``) for the 104M shape at 256 rows on one H100:
9.47 µs, the next 9.85 µs (64 columns) and 9.92 µs (3 stages). In the sampler, 64 columns,
3 stages and 128-wide K steps were all slower."""
ON_CPU = False
"""Tests: run the kernel on CPU tensors (Triton's interpreter, ``TRITON_INTERPRET=1``)."""
_KERNELS: dict[str, Any] = {}


def applies(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether `gate_up_silu` runs for a weight of ``dtype`` on ``device``: CUDA and a half
    dtype with Triton installed (any dtype in the interpreter, `ON_CPU`). The device and
    dtype are checked first: an eager decode step on the CPU asks every step, and looking
    Triton up costs ~36 µs."""
    if not ON_CPU and not (device.type == "cuda" and dtype in (torch.float16, torch.bfloat16)):
        return False
    return importlib.util.find_spec("triton") is not None


def _kernels() -> dict[str, Any]:
    """The Triton kernel (`gate_up_kernels`), imported on first use."""
    if not _KERNELS:
        from rlscope.sampling.backends import gate_up_kernels

        _KERNELS.update(gate_up=gate_up_kernels.gate_up_silu_kernel)
    return _KERNELS


def load() -> None:
    """Import the kernel now, before ``torch.compile`` traces a caller (why:
    `rlscope.sampling.backends.decode_attention.load`)."""
    _kernels()


def reset() -> None:
    """Forget the kernel (tests switching ``TRITON_INTERPRET``)."""
    _KERNELS.clear()
    sys.modules.pop("rlscope.sampling.backends.gate_up_kernels", None)


def gate_up_silu(x_MD: torch.Tensor, w_gu_JD: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` ``[M, I]`` of ``gate, up = F.linear(x, w_gu).split(I, -1)`` for
    ``x_MD`` ``[M, D]`` and the fused ``[2I, D]`` weight, in the weight's dtype. Graph-safe
    (no host reads)."""
    if x_MD.dim() != 2 or w_gu_JD.dim() != 2 or w_gu_JD.shape[1] != x_MD.shape[1] \
            or w_gu_JD.shape[0] % 2 or x_MD.stride(1) != 1 or w_gu_JD.stride(1) != 1 \
            or x_MD.dtype != w_gu_JD.dtype or x_MD.device != w_gu_JD.device:
        raise ValueError(f"gate_up_silu needs x [M, D] and w [2I, D] of one dtype on one "
                         f"device, contiguous in D; got x {tuple(x_MD.shape)} {x_MD.dtype} "
                         f"{x_MD.device}, w {tuple(w_gu_JD.shape)} {w_gu_JD.dtype} "
                         f"{w_gu_JD.device}")
    M, D = x_MD.shape
    inter = int(w_gu_JD.shape[0]) // 2
    block_m, block_n, block_k, warps, stages = TILE
    out_MI = torch.empty(M, inter, dtype=w_gu_JD.dtype, device=x_MD.device)
    grid = (-(-M // block_m) * -(-inter // block_n),)
    _kernels()["gate_up"][grid](x_MD, w_gu_JD, out_MI, M, inter, D, x_MD.stride(0),
                                w_gu_JD.stride(0), out_MI.stride(0), BLOCK_M=block_m,
                                BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps,
                                num_stages=stages)
    return out_MI
