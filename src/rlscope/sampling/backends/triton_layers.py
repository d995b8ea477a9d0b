"""The static sampler's decode layers as Triton kernels only, chained with programmatic
dependent launch (PDL), for `rlscope.sampling.backends.hf_static`'s fused decode step.

Why: at 256 rows every kernel of a decode layer is latency-bound, and each boundary between
two kernels costs a launch gap and a ramp, ~0.45 µs on an H100 (docs/performance.md). PDL
lets a kernel's programs be scheduled while the one ahead finishes, but only between kernels
launched with it, and cuBLAS's products are not. So here every kernel of a layer is Triton:

1. `add_norm`: the residual stream plus the previous layer's split-K down product, RMSNorm;
2. `linear`: the fused q/k/v product with its bias;
3. the rotation, cache write and attention (`decode_attention.decode_attention_rope`);
4. `split_k`: the output projection as float32 partial products over slices of its input;
5. `add_norm`: the residual plus those slices (and the output bias), RMSNorm;
6. `gate_up_silu`: the gate/up product with its SiLU product;
7. `split_k`: the down projection in slices, summed by the next layer's step 1 (or by the
   final norm, whose output `run` returns for the output head).

The products read their operands through TMA descriptors (`layer_kernels`). The arithmetic is
the compiled step's: float32 partial products summed in slice order into the float32
residual stream, bf16 products rounded once (the bias added in float32 first), the SiLU
product rounded as ``F.silu(gate).mul_(up)``; only the order of each product's additions
differs. Valid regime (`applies`): CUDA with compute capability 9.0 or later (TMA), or
Triton's CPU interpreter in tests (`ON_CPU`); a bf16/fp16 sampling dtype over a float32
residual stream; the fused rotation kernel; every slice of a product a whole number of its
tile's input blocks.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from rlscope.sampling.backends import decode_attention


class LayerWeights(Protocol):
    """What `plan` and `run` read of a model's sampling weights
    (`rlscope.sampling.backends.hf_static.HFStaticWeights`)."""

    dtype: torch.dtype
    resid_dtype: torch.dtype
    qk_norm: bool
    n_heads: int
    n_kv: int
    head_dim: int
    intermediate: int
    eps: float
    scale: float
    embed: torch.Tensor
    norm: torch.Tensor
    w_qkv: list[torch.Tensor]
    b_qkv: list[torch.Tensor | None]
    w_o: list[torch.Tensor]
    b_o: list[torch.Tensor | None]
    w_gu: list[torch.Tensor]
    w_down: list[torch.Tensor]
    ln1: list[torch.Tensor]
    ln2: list[torch.Tensor]


class RowKeys(Protocol):
    """Which cache columns each row attends to (`hf_static.DecodeKeys` of the Triton kind)."""

    start_B: torch.Tensor
    used_B: torch.Tensor
    src_B: torch.Tensor
    prompt_cols: int

Tile = tuple[int, int, int, int, int]
"""``(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)`` of a product kernel."""

TILES: dict[str, Tile] = {"qkv": (64, 64, 128, 4, 4), "out": (64, 64, 64, 4, 3),
                          "gate_up": (64, 32, 64, 4, 4), "down": (64, 64, 128, 4, 6)}
"""``(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)`` of each product: the fastest of a
sweep at the 104M shape, 256 rows, on one H100 (µs a call, 12 layers' weights in turn; the
kernel it replaces in brackets): q/k/v with bias 3.89 (cuBLAS 4.33), the output projection in
4 slices 3.36 (cuBLAS batched 3.64), gate/up + SiLU 7.88 (`gate_up.gate_up_silu` 9.40), the
down projection in 2 slices 5.81 (cuBLAS batched: 6.19 in 2 slices, 5.65 in 4)."""
PDL = True
"""Launch the kernels with programmatic dependent launch where the card has it
(`supports_pdl`). False: plain launches (the same arithmetic)."""
SPLIT_OUT = 4
"""Float32 slices of the output projection's input (fewer where the width does not split into
whole blocks of its tile, e.g. 2 at the 0.5B shape; `plan`)."""
SPLIT_DOWN = 2
"""Float32 slices of the down projection's input (as `SPLIT_OUT`): in the 104M sampler on one
H100, 2 slices with their tile gave 503.6k and 504.2k tokens/s against 501.7k and 504.8k for 4
(two calls), and the down product alone 5.81 against 6.02 µs (docs/performance.md)."""
NORM_ROWS = 1
"""Rows a program of `add_norm`: in the 104M sampler on one H100, 1 row (256 programs) gave
504.8k tokens/s against 497.6k for 4 rows and 468.7k for 8 (docs/performance.md)."""
ON_CPU = False
"""Tests: run on CPU tensors in Triton's interpreter (``TRITON_INTERPRET=1``; no PDL; a
float32 sampling dtype allowed, since the interpreter's bf16 products are unreliable)."""
_KERNELS: dict[str, Any] = {}


def _kernels() -> Any:
    """`layer_kernels`, imported on first use."""
    if "module" not in _KERNELS:
        from rlscope.sampling.backends import layer_kernels

        _KERNELS["module"] = layer_kernels
    return _KERNELS["module"]


def load() -> None:
    """Import the kernels and make `uncompiled_run` now, before ``torch.compile`` traces a
    caller (why: `decode_attention.load`)."""
    _kernels()
    uncompiled_run()
    decode_attention.load()


def uncompiled_run() -> Callable[..., torch.Tensor]:
    """`run` left out of ``torch.compile``'s trace (``torch.compiler.disable``, made on first
    use: it imports TorchDynamo): a compiled step calling it breaks its graph there and
    launches these kernels as they are, with PDL, inside the captured CUDA graph."""
    if "run" not in _KERNELS:
        _KERNELS["run"] = torch.compiler.disable(run)
    return _KERNELS["run"]


def supports_pdl(device: torch.device) -> bool:
    """Whether kernels on ``device`` can be launched with PDL: CUDA with compute capability
    9.0 or later, and a Triton with the hooks (``gdc_wait``, ``gdc_launch_dependents``)."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (9, 0):
        return False
    try:
        from triton.language.extra import cuda
    except ImportError:
        return False
    return hasattr(cuda, "gdc_wait") and hasattr(cuda, "gdc_launch_dependents")


def _descriptor(t: torch.Tensor, block: list[int]) -> Any:
    """A host TMA descriptor of the 2-D tensor ``t`` read in ``block`` tiles."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor.from_tensor(t, block)


def _cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive integers (a grid's program count)."""
    return -(-a // b)


def _contiguous(name: str, *tensors: torch.Tensor | None) -> None:
    """Raise ValueError unless every given tensor is contiguous (the kernels index rows by
    their width)."""
    if any(t is not None and not t.is_contiguous() for t in tensors):
        raise ValueError(f"{name} needs contiguous tensors (got strides "
                         f"{[None if t is None else t.stride() for t in tensors]})")


def _tma_ready(name: str, *tensors: torch.Tensor) -> None:
    """Raise ValueError unless every tensor can be read through a TMA descriptor: 2-D,
    contiguous rows, each row starting on a 16-byte boundary."""
    for t in tensors:
        if t.dim() != 2 or t.stride(1) != 1 or (t.stride(0) * t.element_size()) % 16 \
                or t.data_ptr() % 16:
            raise ValueError(f"{name}: a TMA operand needs contiguous rows on 16-byte "
                             f"boundaries (got shape {tuple(t.shape)}, strides {t.stride()})")


def add_norm(x_MD: torch.Tensor, parts_SMD: torch.Tensor | None, bias_D: torch.Tensor | None,
             g_D: torch.Tensor, h_MD: torch.Tensor, eps: float, pdl: bool = False,
             rows: int | None = None) -> None:
    """``x += Σ parts (+ bias)`` (float32, in place; nothing added without ``parts``), then
    ``h = rms_norm(x) · g`` in ``h``'s dtype (`layer_kernels.add_norm_kernel`), ``rows``
    (default `NORM_ROWS`) rows a program."""
    _contiguous("add_norm", x_MD, parts_SMD, bias_D, g_D, h_MD)
    M, D = x_MD.shape
    S = 0 if parts_SMD is None else parts_SMD.shape[0]
    if h_MD.shape != (M, D) or (parts_SMD is not None and parts_SMD.shape[1:] != (M, D)):
        raise ValueError(f"add_norm: x {tuple(x_MD.shape)}, h {tuple(h_MD.shape)} and parts "
                         f"{None if parts_SMD is None else tuple(parts_SMD.shape)} disagree")
    rows = rows or NORM_ROWS
    _kernels().add_norm_kernel[(_cdiv(M, rows),)](
        x_MD, x_MD if parts_SMD is None else parts_SMD, g_D if bias_D is None else bias_D,
        g_D, h_MD, M, eps, N=D, S=S, HAS_BIAS=bias_D is not None, ROWS=rows,
        BN=1 << (D - 1).bit_length(), PDL=pdl, num_warps=4, **decode_attention.launch_options(pdl))


def linear(a_MK: torch.Tensor, w_NK: torch.Tensor, bias_N: torch.Tensor | None,
           out_MN: torch.Tensor, tile: Tile, pdl: bool = False) -> None:
    """``out = a @ w.T (+ bias)`` (`layer_kernels.linear_kernel`)."""
    _tma_ready("linear", a_MK, w_NK)
    _contiguous("linear", bias_N, out_MN)
    bm, bn, bk, warps, stages = tile
    (M, K), N = a_MK.shape, w_NK.shape[0]
    _kernels().linear_kernel[(_cdiv(M, bm), _cdiv(N, bn))](
        _descriptor(a_MK, [bm, bk]), _descriptor(w_NK, [bn, bk]),
        w_NK if bias_N is None else bias_N, out_MN, M, N, K, out_MN.stride(0), BM=bm, BN=bn,
        BK=bk, STAGES=stages, HAS_BIAS=bias_N is not None, PDL=pdl, num_warps=warps,
        **decode_attention.launch_options(pdl))


def split_k(a_MK: torch.Tensor, w_NK: torch.Tensor, parts_SMN: torch.Tensor, tile: Tile,
            pdl: bool = False) -> None:
    """``parts[s] = a[:, slice s] @ w[:, slice s].T`` in float32 over ``len(parts)`` equal
    slices of the input dimension (`layer_kernels.split_k_kernel`)."""
    _tma_ready("split_k", a_MK, w_NK)
    _contiguous("split_k", parts_SMN)
    bm, bn, bk, warps, stages = tile
    S, M, N = parts_SMN.shape
    if a_MK.shape[1] % (S * bk):
        raise ValueError(f"split_k: {S} slices of an input {a_MK.shape[1]} wide are not whole "
                         f"blocks of {bk}; take fewer slices or a narrower block")
    _kernels().split_k_kernel[(_cdiv(M, bm), _cdiv(N, bn), S)](
        _descriptor(a_MK, [bm, bk]), _descriptor(w_NK, [bn, bk]), parts_SMN, M, N,
        a_MK.shape[1], BM=bm, BN=bn, BK=bk, S=S, STAGES=stages, PDL=pdl, num_warps=warps,
        **decode_attention.launch_options(pdl))


def gate_up_silu(x_MD: torch.Tensor, w_gu_JD: torch.Tensor, out_MI: torch.Tensor, tile: Tile,
                 pdl: bool = False) -> None:
    """``out = silu(x @ w[:I].T) * (x @ w[I:].T)`` (`layer_kernels.gate_up_silu_kernel`)."""
    _tma_ready("gate_up_silu", x_MD, w_gu_JD)
    _contiguous("gate_up_silu", out_MI)
    bm, bn, bk, warps, stages = tile
    (M, D), inter = x_MD.shape, out_MI.shape[1]
    _kernels().gate_up_silu_kernel[(_cdiv(M, bm), _cdiv(inter, bn))](
        _descriptor(x_MD, [bm, bk]), _descriptor(w_gu_JD, [bn, bk]), out_MI, M, inter, D,
        out_MI.stride(0), BM=bm, BN=bn, BK=bk, STAGES=stages, PDL=pdl, num_warps=warps,
        **decode_attention.launch_options(pdl))


@dataclass(frozen=True)
class Plan:
    """How a model's decode layers run here, fixed when a bucket is made (later changes to
    the module settings make a new plan, never a stale one)."""

    split_out: int
    """Float32 slices of the output projection."""
    split_down: int
    """Float32 slices of the down projection."""
    pdl: bool
    """Whether the kernels launch with PDL."""
    tiles: tuple[tuple[str, Tile], ...]
    """Each product's tile (`TILES` when planned)."""
    norm_rows: int
    """Rows a program of `add_norm` (`NORM_ROWS` when planned)."""

    def tile(self, name: str) -> Tile:
        """The tile of product ``name``."""
        return dict(self.tiles)[name]


def settings() -> tuple[Any, ...]:
    """The module settings a `Plan` depends on (a cache key for plans)."""
    return (SPLIT_OUT, SPLIT_DOWN, PDL, tuple(sorted(TILES.items())), NORM_ROWS)


def _smem_bytes(tile: Tile, weight_tiles: int, itemsize: int) -> int:
    """Shared memory a product kernel's pipeline holds: ``num_stages`` × (an input tile and
    ``weight_tiles`` weight tiles of ``BLOCK_K``), plus 1 KiB for barriers. Matches Triton's
    figures for these kernels on sm_90 (e.g. 196,656 bytes for 64 × 64 × 128 at 6 stages)."""
    bm, bn, bk, _, stages = tile
    return stages * (bm + weight_tiles * bn) * bk * itemsize + 1024


def _fits_shared_memory(device: torch.device, itemsize: int) -> bool:
    """Whether every `TILES` product fits the card's shared memory a block (the opt-in limit;
    without it in ``torch``'s device properties, Hopper's 227 KiB on compute capability 9.x
    only). Cards of compute capability 12 have about 99 KiB."""
    need = max(_smem_bytes(TILES[name], 2 if name == "gate_up" else 1, itemsize)
               for name in TILES)
    limit = getattr(torch.cuda.get_device_properties(device), "shared_memory_per_block_optin",
                    None)
    if limit is None:
        return torch.cuda.get_device_capability(device)[0] == 9 and need <= 232_448
    return need <= int(limit)


def _slices(width: int, count: int, block: int) -> int:
    """The most slices, at most ``count`` (and at least 1: one float32 product), into which
    ``width`` splits as whole ``block``s; 0 if none does."""
    for s in range(max(count, 1), 0, -1):
        if width % s == 0 and (width // s) % block == 0:
            return s
    return 0


def _power_of_two(n: object) -> bool:
    return isinstance(n, int) and n >= 1 and n & (n - 1) == 0


def setting_errors() -> list[str]:
    """What in the module settings no kernel can run, each said as what to change (they can
    be set from outside, e.g. ``benchmarks/sampler_ab.py``'s variants)."""
    errors = []
    if not _power_of_two(NORM_ROWS):
        errors.append(f"triton_layers.NORM_ROWS must be a power of two >= 1 (got {NORM_ROWS!r})")
    for name, value in (("SPLIT_OUT", SPLIT_OUT), ("SPLIT_DOWN", SPLIT_DOWN)):
        if not isinstance(value, int) or value < 1:
            errors.append(f"triton_layers.{name} must be an integer >= 1 (got {value!r})")
    if set(TILES) != {"qkv", "out", "gate_up", "down"}:
        errors.append(f"triton_layers.TILES needs the tiles of qkv, out, gate_up and down "
                      f"(got {sorted(TILES)})")
    for name, tile in TILES.items():
        if not (isinstance(tile, tuple) and len(tile) == 5
                and all(_power_of_two(v) for v in tile[:4]) and isinstance(tile[4], int)
                and tile[4] >= 1 and tile[0] >= 16 and tile[1] >= 16 and tile[2] >= 16):
            errors.append(f"triton_layers.TILES[{name!r}] must be (BLOCK_M, BLOCK_N, BLOCK_K, "
                          f"num_warps, num_stages): powers of two, blocks >= 16, stages >= 1 "
                          f"(got {tile!r})")
    return errors


def plan(weights: LayerWeights, device: torch.device) -> Plan | None:
    """The `Plan` for ``weights`` on ``device`` from the module settings (`SPLIT_OUT`,
    `SPLIT_DOWN`, `PDL`, `TILES`, `NORM_ROWS`), or None where these kernels do not apply
    (see the module docstring; also where the tiles need more shared memory than the card
    has). Raises ValueError for settings no kernel can run (`setting_errors`)."""
    errors = setting_errors()
    if errors:
        raise ValueError("; ".join(errors))
    w = weights
    if ON_CPU:
        on = device.type == "cpu"
    else:
        on = device.type == "cuda" and torch.cuda.get_device_capability(device) >= (9, 0)
    half = (torch.float16, torch.bfloat16) + ((torch.float32,) if ON_CPU else ())
    if not on or importlib.util.find_spec("triton") is None or w.dtype not in half \
            or importlib.util.find_spec("triton.tools.tensor_descriptor") is None \
            or w.resid_dtype != torch.float32 or w.qk_norm:
        return None
    if not ON_CPU and not _fits_shared_memory(device, w.dtype.itemsize):
        return None
    E, D = w.n_heads * w.head_dim, int(w.embed.shape[1])
    if D % TILES["qkv"][2] or D % TILES["gate_up"][2] or D % 8 or E % 8 or w.intermediate % 8:
        return None
    s_out = _slices(E, SPLIT_OUT, TILES["out"][2])
    s_down = _slices(w.intermediate, SPLIT_DOWN, TILES["down"][2])
    if not s_out or not s_down:
        return None
    return Plan(s_out, s_down, PDL and not ON_CPU and supports_pdl(device),
                tuple(sorted(TILES.items())), NORM_ROWS)


def run(weights: LayerWeights, layers: Plan, x_BD: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor], rope_row_B: torch.Tensor, col_1: torch.Tensor,
        keys: RowKeys, k_cache: list[torch.Tensor], v_cache: list[torch.Tensor]
        ) -> torch.Tensor:
    """Every decode layer of ``weights`` on the float32 residual stream ``x_BD`` (updated in
    place) as ``layers`` says, where `hf_static.HFStaticWeights._decode_fused` would run its
    own; returns the final norm's output ``[B, D]`` in the sampling dtype, for the output head.
    ``keys``: each row's columns (`RowKeys`; the group's prompt row ``src_B`` set). Graph-safe
    (no host reads)."""
    w, pdl = weights, layers.pdl
    B, D = x_BD.shape
    dt, dev = w.dtype, x_BD.device
    X = (w.n_heads + 2 * w.n_kv) * w.head_dim
    h_BD = torch.empty(B, D, dtype=dt, device=dev)
    qkv_BX = torch.empty(B, X, dtype=dt, device=dev)
    act_BI = torch.empty(B, w.intermediate, dtype=dt, device=dev)
    out_parts_SBD = torch.empty(layers.split_out, B, D, dtype=torch.float32, device=dev)
    down_parts_SBD = torch.empty(layers.split_down, B, D, dtype=torch.float32, device=dev)
    cos_RD, sin_signed_RD = rope
    parts_SBD: torch.Tensor | None = None  # the previous layer's down product
    for i in range(len(w.w_qkv)):
        add_norm(x_BD, parts_SBD, None, w.ln1[i], h_BD, w.eps, pdl, layers.norm_rows)
        linear(h_BD, w.w_qkv[i], w.b_qkv[i], qkv_BX, layers.tile("qkv"), pdl)
        o_BHD = decode_attention.decode_attention_rope(
            qkv_BX, cos_RD, sin_signed_RD, k_cache[i], v_cache[i], col_1, keys.start_B,
            keys.used_B, w.n_heads, w.scale, keys.src_B, keys.prompt_cols, rope_row_B,
            pdl=pdl)
        split_k(o_BHD.view(B, -1), w.w_o[i], out_parts_SBD, layers.tile("out"), pdl)
        add_norm(x_BD, out_parts_SBD, w.b_o[i], w.ln2[i], h_BD, w.eps, pdl, layers.norm_rows)
        gate_up_silu(h_BD, w.w_gu[i], act_BI, layers.tile("gate_up"), pdl)
        split_k(act_BI, w.w_down[i], down_parts_SBD, layers.tile("down"), pdl)
        parts_SBD = down_parts_SBD
    add_norm(x_BD, parts_SBD, None, w.norm, h_BD, w.eps, pdl, layers.norm_rows)
    return h_BD
