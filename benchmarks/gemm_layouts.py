"""Decode-step matmuls at a small row count: which weight layout cuBLAS runs fastest.

The static sampler's decode step multiplies ``[B, D_in]`` activations (B = the batch, 256 in
issue 17's table) by each projection's weight. At such a small B, cuBLAS's kernel choice
depends on the operands' layout, and the fastest one reads the weight at a fraction of the
card's bandwidth (``benchmarks/profile_engine.py``). This times, from CUDA graphs, each
projection shape of ``--models`` in four forms: ``F.linear(x, W)`` (W ``[out, in]``),
``x @ W.T``, ``x @ Wt`` with ``Wt = W.T.contiguous()`` (``[in, out]``), and
``torch.mm`` into a preallocated output; and split-K forms ``splitS`` (S = 2, 4, 8): the
input dimension cut into S slices multiplied as one strided batched matmul with float32
outputs (``torch.bmm(..., out_dtype=torch.float32)``, no copies of either operand), then
summed over S (``splitS+sum``; in the sampler the sum would fuse into the next elementwise
kernel). The gate/up shape also gets ``linear+silu`` (the product, then
``F.silu(gate).mul_(up)``, eager) and ``gate_up_silu`` (both as one Triton kernel,
`rlscope.sampling.backends.gate_up`). Prints JSON (µs per call and the weight's GB/s).

``--gate_up_tiles`` instead times every tile of `TILES` for `gate_up.gate_up_silu` over
``--layers`` distinct weights in turn (as a decode position meets them, so the weights come
from memory, not L2), each checked against the unfused steps (largest absolute difference),
fastest first; that is how `gate_up.TILE` was chosen.

    python benchmarks/gemm_layouts.py --models qwen0.5b 104m --rows 256
    python benchmarks/gemm_layouts.py --models 104m --gate_up_tiles
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from rlscope.sampling.backends import gate_up

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_engine import SHAPES
from profile_engine import emit, graph_time_us

TILES = [(bm, bn, bk, warps, stages) for bm in (64, 128, 256) for bn in (32, 64, 128)
         for bk in (64, 128) for warps in (4, 8) for stages in (3, 4)
         if not (bm == 256 and bn == 128)]
"""``(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)`` tiles ``--gate_up_tiles`` tries
(64)."""


def shapes(model: str) -> dict[str, tuple[int, int]]:
    """``name -> (in, out)`` of the decode step's projections."""
    s = SHAPES[model]
    D, mlp, H, K = s["hidden_size"], s["intermediate_size"], s["num_attention_heads"], \
        s["num_key_value_heads"]
    Dh = D // H
    return {"qkv": (D, (H + 2 * K) * Dh), "o": (H * Dh, D), "gate_up": (D, 2 * mlp),
            "down": (mlp, D), "head": (D, s["vocab_size"])}


def split_k(x_MK: torch.Tensor, W_NK: torch.Tensor, S: int, reduce: bool) -> torch.Tensor:
    """``x @ W.T`` as ``S`` float32 partial products over slices of the input dimension (one
    strided batched matmul), summed over the slices when ``reduce``."""
    M, K = x_MK.shape
    N = W_NK.shape[0]
    x_SMk = x_MK.view(M, S, K // S).transpose(0, 1)
    w_SkN = W_NK.view(N, S, K // S).permute(1, 2, 0)
    parts_SMN = torch.bmm(x_SMk, w_SkN, out_dtype=torch.float32)
    return parts_SMN.sum(0) if reduce else parts_SMN


def unfused_gate_up(x_MD: torch.Tensor, w_JD: torch.Tensor) -> torch.Tensor:
    """The decode step's gate/up product, then its SiLU product, as separate steps."""
    gate, up = F.linear(x_MD, w_JD).split(w_JD.shape[0] // 2, -1)
    return F.silu(gate).mul_(up)


def _each_weight(x: torch.Tensor, ws: list[torch.Tensor]) -> list[torch.Tensor]:
    return [gate_up.gate_up_silu(x, w) for w in ws]


def gate_up_tiles(model: str, rows: int, layers: int) -> list[dict[str, Any]]:
    """µs a call of `gate_up.gate_up_silu` at each tile of `TILES` over ``layers`` distinct
    weights of ``model``'s gate/up shape, with its largest absolute difference from
    `unfused_gate_up`; fastest first (a tile that fails to compile is kept with its error)."""
    n_in, n_out = shapes(model)["gate_up"]
    dev, dt = torch.device("cuda"), torch.bfloat16
    x = torch.randn(rows, n_in, device=dev, dtype=dt)
    ws = [torch.randn(n_out, n_in, device=dev, dtype=dt) * 0.03 for _ in range(layers)]
    want = unfused_gate_up(x, ws[0]).float()
    saved, found = gate_up.TILE, []
    try:
        for tile in TILES:
            gate_up.TILE = tile
            try:
                diff = (gate_up.gate_up_silu(x, ws[0]).float() - want).abs().max().item()
                us = graph_time_us(partial(_each_weight, x, ws), 100)
                found.append({"tile": list(tile), "us": round(us / layers, 2),
                              "max_abs_diff": diff})
            except Exception as err:  # e.g. a tile out of shared memory
                found.append({"tile": list(tile), "us": None, "error": str(err)[:200]})
    finally:
        gate_up.TILE = saved
    return sorted(found, key=lambda f: f["us"] if f["us"] is not None else float("inf"))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["qwen0.5b", "104m"], choices=list(SHAPES))
    p.add_argument("--rows", type=int, nargs="+", default=[256], help="activation rows")
    p.add_argument("--output", default=None, help="also write the JSON here")
    p.add_argument("--gate_up_tiles", action="store_true",
                   help="time every tile of the fused gate/up kernel instead (TILES)")
    p.add_argument("--layers", type=int, default=12,
                   help="distinct weights per timed call with --gate_up_tiles")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit(f"{Path(__file__).name} profiles GPU kernels: it needs a CUDA device")
    if args.layers < 1:
        raise SystemExit(f"--layers must be at least 1, got {args.layers}")
    dev, dt = torch.device("cuda"), torch.bfloat16
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    if args.gate_up_tiles:
        for model in args.models:
            for rows in args.rows:
                res[f"{model}/{rows}/gate_up_tiles"] = tiles = gate_up_tiles(model, rows,
                                                                              args.layers)
                print(f"{model} {rows} gate_up: best {tiles[0]}", file=sys.stderr)
        emit(res, args.output)
        return res
    for model in args.models:
        for rows in args.rows:
            for name, (n_in, n_out) in shapes(model).items():
                x = torch.randn(rows, n_in, device=dev, dtype=dt)
                W = torch.randn(n_out, n_in, device=dev, dtype=dt) * 0.02
                Wt = W.T.contiguous()
                out = torch.empty(rows, n_out, device=dev, dtype=dt)
                forms = {"linear": lambda x=x, W=W: F.linear(x, W),
                         "x@W.T": lambda x=x, W=W: x @ W.T,
                         "x@Wt": lambda x=x, Wt=Wt: x @ Wt,
                         "mm_out": lambda x=x, Wt=Wt, out=out: torch.mm(x, Wt, out=out)}
                if name == "gate_up":
                    forms["linear+silu"] = partial(unfused_gate_up, x, W)
                    if gate_up.applies(dev, dt):
                        forms["gate_up_silu"] = partial(gate_up.gate_up_silu, x, W)
                for S in (2, 4, 8):
                    if n_in % S == 0 and n_out < 100_000:
                        forms[f"split{S}"] = partial(split_k, x, W, S, False)
                        forms[f"split{S}+sum"] = partial(split_k, x, W, S, True)
                cell: dict[str, Any] = {}
                for form, fn in forms.items():
                    us = graph_time_us(fn, iters=200)
                    cell[form] = {"us": round(us, 2),
                                  "weight_GBps": round(W.numel() * 2 / us / 1e3, 1)}
                res[f"{model}/{rows}/{name}"] = cell
                print(f"{model} {rows} {name}: " + ", ".join(
                    f"{f} {c['us']}us" for f, c in cell.items()), file=sys.stderr)
    emit(res, args.output)
    return res


if __name__ == "__main__":
    main()
