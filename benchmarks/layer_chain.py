"""The decode layer's products as chains of kernels replayed from one CUDA graph: cuBLAS against
Triton, and Triton with programmatic dependent launch (PDL). Prints JSON.

Why: a 104M decode position is ~100 kernels, and each boundary costs a launch gap and a ramp
(docs/performance.md). PDL lets a kernel be scheduled while the one ahead finishes, but only
between kernels launched with it, which cuBLAS's are not. This measures what a layer of
Triton kernels with PDL would give against today's mix, before anyone builds it into the
sampler. Every time is µs a call over ``--layers`` layers' own weights (so the weights come
from memory as in the sampler), ``--rows`` rows, bf16.

Sections (``--sections``):
- ``products``: each product alone, cuBLAS against the fastest Triton tile of `TILES`
  (q/k/v, output and down projections: `matmul_kernel`; gate/up with its SiLU product:
  `gate_up_silu_kernel` against cuBLAS's plain ``[M, 2I]`` product).
- ``chain``: the four products one after another: ``cublas``, ``triton`` (the tiles found),
  ``pdl`` (the next kernel released after the loop), ``pdl_early`` (released at the start),
  ``pdl_prefetch`` (each program asks L2 for its weight tile before it waits).
- ``layer``: six kernels a layer, no attention: norm, q/k/v, output projection in ``--split``
  float32 slices, norm with the residual and the slices' sum, gate/up + SiLU, down projection
  in slices. ``today`` is the sampler's mix (cuBLAS q/k/v, cuBLAS batched split-K products,
  the Triton gate/up kernel); ``triton`` is Triton throughout; ``triton_pdl`` adds PDL.
- ``down_sweep``: the Triton split-K down projection over slice counts and tiles against
  cuBLAS's batched product, for ``--sweep_seconds`` at most.

``--check`` runs each kernel once against torch at small float32 shapes instead (on CPU in
Triton's interpreter, ``TRITON_INTERPRET=1``, as the test does; PDL and the L2 prefetch need a
GPU). Example (one H100, ~30 s)::

    python benchmarks/layer_chain.py --sections products chain layer --output chain.json
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from rlscope.utils import environment_info

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_engine import SHAPES
from profile_engine import emit, graph_time_us

SECTIONS = ("products", "chain", "layer", "down_sweep")
Tile = tuple[int, int, int, int, int]
TILES: tuple[Tile, ...] = ((64, 64, 64, 4, 3), (64, 32, 64, 4, 4), (64, 128, 64, 4, 3),
                           (128, 64, 64, 4, 3), (64, 64, 128, 4, 3), (64, 32, 128, 4, 3),
                           (128, 32, 64, 4, 4), (64, 64, 64, 4, 4))
"""``(BM, BN, BK, num_warps, num_stages)`` tried for each product; a tile that does not divide
the product's shape is skipped."""
CHAIN_MODES = ("cublas", "triton", "pdl", "pdl_early", "pdl_prefetch")
LAYER_MODES = ("today", "triton", "triton_pdl")


def log(msg: str) -> None:
    print(f"[layer_chain] {msg}", file=sys.stderr, flush=True)


def kernels() -> ModuleType:
    """`layer_chain_kernels`, imported on first use (after ``TRITON_INTERPRET`` is set)."""
    import layer_chain_kernels

    return layer_chain_kernels


def _pdl(on: bool) -> dict[str, bool]:
    return {"launch_pdl": True} if on else {}


def matmul(a: torch.Tensor, w: torch.Tensor, c: torch.Tensor, tile: Tile, pdl: bool = False,
           early: bool = False, prefetch: bool = False) -> None:
    """``c = a @ w.T`` with `matmul_kernel` (``tile`` must divide the shapes)."""
    bm, bn, bk, warps, stages = tile
    (M, K), N = a.shape, w.shape[0]
    kernels().matmul_kernel[(M // bm, N // bn)](
        a, w, c, M, N, K, a.stride(0), w.stride(0), c.stride(0), BM=bm, BN=bn, BK=bk, PDL=pdl,
        EARLY=early, PREFETCH=prefetch, LINES=1 << max(0, (K // 64 - 1).bit_length()),
        num_warps=warps, num_stages=stages, **_pdl(pdl))


def split_k(a: torch.Tensor, w: torch.Tensor, parts: torch.Tensor, tile: Tile,
            pdl: bool = False) -> None:
    """``parts[s] = a[:, slice s] @ w[:, slice s].T`` (float32) with `split_k_kernel`."""
    bm, bn, bk, warps, stages = tile
    S, M, N = parts.shape
    kernels().split_k_kernel[(M // bm, N // bn, S)](
        a, w, parts, M, N, a.shape[1], a.stride(0), w.stride(0), BM=bm, BN=bn, BK=bk, S=S,
        PDL=pdl, num_warps=warps, num_stages=stages, **_pdl(pdl))


def split_k_bmm(a: torch.Tensor, w: torch.Tensor, parts: torch.Tensor) -> None:
    """The sampler's split-K product (`hf_static.split_k_linear` before its sum): one cuBLAS
    batched product into ``parts``."""
    S, M, N = parts.shape
    width = a.shape[1] // S
    torch.bmm(a.view(M, S, width).transpose(0, 1), w.view(N, S, width).permute(1, 2, 0),
              out_dtype=torch.float32, out=parts)


def gate_up_silu(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, tile: Tile,
                 pdl: bool = False) -> None:
    """``silu(x @ w[:I].T) * (x @ w[I:].T)`` into ``out`` with `gate_up_silu_kernel`."""
    bm, bn, bk, warps, stages = tile
    (M, K), inter = x.shape, out.shape[1]
    kernels().gate_up_silu_kernel[((M // bm) * (inter // bn),)](
        x, w, out, M, inter, K, x.stride(0), w.stride(0), out.stride(0), BM=bm, BN=bn, BK=bk,
        PDL=pdl, num_warps=warps, num_stages=stages, **_pdl(pdl))


def add_norm(x: torch.Tensor, parts: torch.Tensor, g: torch.Tensor, h: torch.Tensor,
             pdl: bool = False, rows: int = 4) -> None:
    """``x += parts.sum(0)``; ``h = rmsnorm(x) * g`` with `add_norm_kernel`."""
    M, N = x.shape
    kernels().add_norm_kernel[(M // rows,)](
        x, parts, g, h, M, N=N, S=parts.shape[0], ROWS=rows,
        BN=1 << (N - 1).bit_length(), PDL=pdl, eps=1e-6, num_warps=4, **_pdl(pdl))


def fits(tile: Tile, M: int, N: int, K: int) -> bool:
    return M % tile[0] == 0 and N % tile[1] == 0 and K % tile[2] == 0


class Layers:
    """``layers`` layers' random bf16 weights of one model shape and the buffers a chain
    writes (each product reads the one ahead's output)."""

    def __init__(self, shape: dict[str, Any], rows: int, layers: int, split: int,
                 device: torch.device, dtype: torch.dtype = torch.bfloat16) -> None:
        D, inter = shape["hidden_size"], shape["intermediate_size"]
        X = (shape["num_attention_heads"] + 2 * shape["num_key_value_heads"]) \
            * (D // shape["num_attention_heads"])
        g = torch.Generator(device=device).manual_seed(0)

        def weight(n_out: int, n_in: int) -> torch.Tensor:
            return (torch.randn(n_out, n_in, device=device, generator=g)
                    * n_in ** -0.5).to(dtype)

        self.M, self.D, self.X, self.inter, self.split = rows, D, X, inter, split
        self.w = [{"qkv": weight(X, D), "o": weight(D, D), "gate_up": weight(2 * inter, D),
                   "down": weight(D, inter)} for _ in range(layers)]
        self.norm_g = torch.ones(D, device=device)
        self.x = torch.randn(rows, D, device=device)
        self.out = {"qkv": torch.zeros(rows, X, device=device, dtype=dtype),
                    "o": torch.zeros(rows, D, device=device, dtype=dtype),
                    "gate_up": torch.zeros(rows, inter, device=device, dtype=dtype),
                    "down": torch.zeros(rows, D, device=device, dtype=dtype)}
        self.h = torch.zeros(rows, D, device=device, dtype=dtype)
        self.parts = torch.zeros(split, rows, D, device=device)

    def input(self, name: str) -> torch.Tensor:
        """The input each product reads: the output of the one ahead (q/k/v's first ``D``
        columns stand in for the attention output)."""
        return {"qkv": self.out["down"], "o": self.out["qkv"][:, :self.D],
                "gate_up": self.out["o"], "down": self.out["gate_up"]}[name]

    def dims(self, name: str) -> tuple[int, int]:
        """``(N, K)`` of a product (gate/up: its ``I`` output columns)."""
        return {"qkv": (self.X, self.D), "o": (self.D, self.D), "gate_up": (self.inter, self.D),
                "down": (self.D, self.inter)}[name]

    def product_of(self, i: int, name: str, mode: str, tile: Tile) -> None:
        """`product` with the layer first (for `each_layer`)."""
        self.product(name, i, mode, tile)

    def split_product_of(self, i: int, name: str, tile: Tile) -> None:
        """Layer ``i``'s product ``name`` as Triton split-K slices into ``parts``."""
        split_k(self.input(name), self.w[i][name], self.parts, tile)

    def chain_of(self, i: int, mode: str, tiles: dict[str, Tile]) -> None:
        """Layer ``i``'s four products in turn."""
        for name in ("qkv", "o", "gate_up", "down"):
            self.product(name, i, mode, tiles[name])

    def down_split_of(self, i: int, parts: torch.Tensor, tile: Tile | None) -> None:
        """Layer ``i``'s down projection in ``len(parts)`` slices: cuBLAS's batched product
        (``tile`` None) or Triton's split-K kernel."""
        if tile is None:
            split_k_bmm(self.out["gate_up"], self.w[i]["down"], parts)
        else:
            split_k(self.out["gate_up"], self.w[i]["down"], parts, tile)

    def product(self, name: str, i: int, mode: str, tile: Tile) -> None:
        """Layer ``i``'s product ``name``: cuBLAS, or Triton with the ``mode``'s PDL hooks."""
        a, w, c = self.input(name), self.w[i][name], self.out[name]
        if mode == "cublas":
            if name == "gate_up":
                torch.mm(a, w.t())
            else:
                torch.mm(a, w.t(), out=c)
        elif name == "gate_up":
            gate_up_silu(a, w, c, tile, pdl=mode != "triton")
        else:
            matmul(a, w, c, tile, pdl=mode != "triton", early=mode == "pdl_early",
                   prefetch=mode == "pdl_prefetch")


def time_us(fn: Callable[[], Any], layers: int, iters: int) -> float:
    return round(graph_time_us(fn, iters=iters) / layers, 2)


def each_layer(layers: int, call: Callable[..., None], *args: Any) -> Callable[[], None]:
    """A function running ``call(i, *args)`` for every layer ``i`` (what a graph replays)."""
    def f() -> None:
        for i in range(layers):
            call(i, *args)
    return f


def best_tiles(net: Layers, iters: int) -> dict[str, Any]:
    """Each product alone: cuBLAS, and every fitting tile of `TILES` in Triton."""
    out: dict[str, Any] = {}
    L = len(net.w)
    for name in ("qkv", "o", "gate_up", "down"):
        N, K = net.dims(name)
        times = {}
        for tile in TILES:
            if fits(tile, net.M, N, K):
                times[tile] = time_us(each_layer(L, net.product_of, name, "triton", tile), L,
                                      iters)
        if not times:
            raise SystemExit(f"no tile of TILES divides the {name} product ({net.M} x {N} x {K})")
        best = min(times, key=lambda t: times[t])
        cublas = time_us(each_layer(L, net.product_of, name, "cublas", best), L, iters)
        out[name] = {"cublas_us": cublas, "triton_us": times[best], "tile": list(best),
                     "tiles_us": {str(list(t)): v for t, v in times.items()}}
        log(f"{name}: cuBLAS {cublas} µs, Triton {times[best]} µs ({best})")
    return out


def run_chain(net: Layers, tiles: dict[str, Tile], iters: int, repeats: int) -> dict[str, Any]:
    L = len(net.w)
    res: dict[str, list[float]] = {m: [] for m in CHAIN_MODES}
    for _ in range(repeats):
        for mode in CHAIN_MODES:
            res[mode].append(time_us(each_layer(L, net.chain_of, mode, tiles), L, iters))
    log(f"chain (µs a layer): {res}")
    return {"us_a_layer": res}


def split_tiles(net: Layers, iters: int) -> dict[str, Tile]:
    """The fastest fitting `TILES` for the output and down projections in ``split`` slices."""
    L = len(net.w)
    found = {}
    for name in ("o", "down"):
        N, K = net.dims(name)
        times = {t: time_us(each_layer(L, net.split_product_of, name, t), L, iters)
                 for t in TILES if fits(t, net.M, N, K // net.split)}
        if not times:
            raise SystemExit(f"no tile of TILES divides the split {name} product")
        found[name] = min(times, key=lambda t: times[t])
    return found


def run_layer(net: Layers, qkv_tile: Tile, gate_up_tile: Tile, iters: int,
              repeats: int) -> dict[str, Any]:
    L = len(net.w)
    tiles = split_tiles(net, iters)

    def layer(mode: str) -> Callable[[], None]:
        pdl = mode == "triton_pdl"

        def f() -> None:
            for i in range(L):
                w = net.w[i]
                add_norm(net.x, net.parts, net.norm_g, net.h, pdl)
                if mode == "today":
                    torch.mm(net.h, w["qkv"].t(), out=net.out["qkv"])
                    split_k_bmm(net.out["qkv"][:, :net.D], w["o"], net.parts)
                else:
                    matmul(net.h, w["qkv"], net.out["qkv"], qkv_tile, pdl)
                    split_k(net.out["qkv"][:, :net.D], w["o"], net.parts, tiles["o"], pdl)
                add_norm(net.x, net.parts, net.norm_g, net.h, pdl)
                gate_up_silu(net.h, w["gate_up"], net.out["gate_up"], gate_up_tile, pdl)
                if mode == "today":
                    split_k_bmm(net.out["gate_up"], w["down"], net.parts)
                else:
                    split_k(net.out["gate_up"], w["down"], net.parts, tiles["down"], pdl)
        return f

    res: dict[str, list[float]] = {m: [] for m in LAYER_MODES}
    for _ in range(repeats):
        for mode in LAYER_MODES:
            net.x.normal_()
            res[mode].append(time_us(layer(mode), L, iters))
    log(f"layer (µs a layer): {res}")
    return {"us_a_layer": res, "split_tiles": {k: list(v) for k, v in tiles.items()}}


def run_down_sweep(net: Layers, iters: int, seconds: float) -> dict[str, Any]:
    L = len(net.w)
    out: dict[str, Any] = {"cublas_us": {}, "triton_us": {}}
    t0 = time.perf_counter()
    for S in (4, 6, 8):
        if net.inter % S:
            continue
        parts = torch.zeros(S, net.M, net.D, device=net.x.device)
        out["cublas_us"][S] = time_us(each_layer(L, net.down_split_of, parts, None), L, iters)
        for tile in itertools.product((64, 128), (32, 64, 128), (64, 128), (4, 8), (3, 4, 5)):
            if time.perf_counter() - t0 > seconds:
                out["stopped_early"] = True
                break
            if fits(tile, net.M, net.D, net.inter // S) and tile[:3] != (128, 128, 128):
                out["triton_us"][str([S, *tile])] = time_us(
                    each_layer(L, net.down_split_of, parts, tile), L, iters)
    ranked = sorted(out["triton_us"].items(), key=lambda kv: kv[1])
    out["fastest"] = ranked[:8]
    log(f"down sweep: cuBLAS {out['cublas_us']}, fastest Triton {ranked[:3]}")
    return out


def check(device: torch.device) -> dict[str, float]:
    """Each kernel once against torch (float32, small shapes with several programs on every
    axis): the largest absolute differences."""
    g = torch.Generator().manual_seed(0)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(device)

    M, N, K, S = 64, 96, 256, 4
    a, w = rnd(M, K), rnd(N, K)
    c = torch.zeros(M, N, device=device)
    matmul(a, w, c, (32, 32, 64, 4, 2))
    errs = {"matmul": (c - a @ w.t()).abs().max().item()}
    parts = torch.zeros(S, M, N, device=device)
    split_k(a, w, parts, (32, 32, 32, 4, 2))
    want = torch.stack([a[:, s * K // S:(s + 1) * K // S] @ w[:, s * K // S:(s + 1) * K // S].t()
                        for s in range(S)])
    errs["split_k"] = (parts - want).abs().max().item()
    x, gain, h = rnd(M, N), rnd(N), torch.zeros(M, N, device=device)
    x_new = x + parts.sum(0)
    add_norm(x, parts, gain, h)
    errs["add_norm_residual"] = (x - x_new).abs().max().item()
    errs["add_norm"] = (h - x_new * torch.rsqrt(x_new.pow(2).mean(1, keepdim=True) + 1e-6)
                        * gain).abs().max().item()
    w_gu, act = rnd(2 * N, K) * 0.1, torch.zeros(M, N, device=device)
    gate_up_silu(a, w_gu, act, (32, 32, 64, 4, 2))
    gate, up = (a @ w_gu.t()).split(N, -1)
    errs["gate_up_silu"] = (act - torch.nn.functional.silu(gate) * up).abs().max().item()
    return errs


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    a = p.add_argument
    a("--sections", nargs="+", default=["products", "chain", "layer"], choices=SECTIONS,
      help="what to measure (see the module docstring)")
    a("--model", default="104m", choices=[k for k in SHAPES if k != "tiny"],
      help="model shape whose layer is measured (hf_engine.SHAPES)")
    a("--rows", type=int, default=256, help="rows a product (the sampler's batch)")
    a("--layers", type=int, default=12, help="layers, each with its own weights, a replay")
    a("--split", type=int, default=4, help="float32 slices of the split-K products (layer)")
    a("--iters", type=int, default=50, help="graph replays a timing")
    a("--repeats", type=int, default=2, help="times each chain and layer mode is timed, in turn")
    a("--sweep_seconds", type=float, default=150.0, help="time limit of down_sweep")
    a("--check", action="store_true",
      help="instead: each kernel against torch at small float32 shapes (CPU: set "
           "TRITON_INTERPRET=1)")
    a("--output", default="", help="also write the JSON to this file")
    return p


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser()
    args = p.parse_args(argv)
    if args.check:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        res: dict[str, Any] = {"benchmark": "layer_chain", "check": check(device),
                               "device": str(device)}
    else:
        errors = [f"--{flag} must be >= 1 (got {getattr(args, flag)})"
                  for flag in ("rows", "layers", "split", "iters", "repeats")
                  if getattr(args, flag) < 1]
        if not torch.cuda.is_available():
            errors.append("CUDA is not available here: the timings need a GPU (use --check "
                          "with TRITON_INTERPRET=1 to run the kernels on CPU)")
        if errors:
            p.error("; ".join(errors))
        net = Layers(SHAPES[args.model], args.rows, args.layers, args.split,
                     torch.device("cuda"))
        if net.D % args.split or net.inter % args.split:
            p.error(f"--split {args.split} must divide the hidden size {net.D} and the MLP "
                    f"width {net.inter}")
        res = {"benchmark": "layer_chain", "config": vars(args),
               "card": torch.cuda.get_device_name()}
        tiles: dict[str, Tile] = {}
        if {"products", "chain", "layer"} & set(args.sections):
            found = best_tiles(net, args.iters)
            tiles = {k: tuple(v["tile"]) for k, v in found.items()}  # type: ignore[misc]
            if "products" in args.sections:
                res["products"] = found
        if "chain" in args.sections:
            res["chain"] = run_chain(net, tiles, args.iters, args.repeats)
        if "layer" in args.sections:
            res["layer"] = run_layer(net, tiles["qkv"], tiles["gate_up"], args.iters,
                                     args.repeats)
        if "down_sweep" in args.sections:
            res["down_sweep"] = run_down_sweep(net, args.iters, args.sweep_seconds)
    res["environment"] = environment_info(torch.device("cuda" if torch.cuda.is_available()
                                                       else "cpu"))
    emit(res, args.output)
    return res


if __name__ == "__main__":
    main()
