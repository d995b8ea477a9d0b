"""The decode layer's products as chains of kernels replayed from one CUDA graph: cuBLAS against
Triton, and Triton with programmatic dependent launch (PDL). Prints JSON.

Why: a 104M decode position is ~100 kernels, and each boundary costs a launch gap and a ramp
(docs/performance.md). PDL lets a kernel be scheduled while the one ahead finishes, but only
between kernels launched with it, which cuBLAS's are not. This measures what a layer of
Triton kernels with PDL would give against today's mix, before anyone builds it into the
sampler. Every time is µs a call over ``--layers`` layers' own weights (so the weights come
from memory as in the sampler), ``--rows`` rows, bf16, random data.

Sections (``--sections``):
- ``products``: each of the four products alone (q/k/v; output; gate/up as the plain
  ``[M, 2I]`` product; down), cuBLAS against the fastest Triton tile of `TILES`
  (`matmul_kernel`).
- ``chain``: the four products one after another, each reading the one ahead's output:
  ``cublas``; ``triton`` (the tiles found); with PDL, ``pdl`` (each kernel waits before its
  loop and releases the next after it), ``pdl_early`` (releases the next at its start),
  ``pdl_prefetch`` and ``pdl_early_prefetch`` (the same, each program first asking L2 for its
  whole weight tile, before it waits).
- ``layer``: six kernels a layer, no attention: norm, q/k/v, output projection in ``--split``
  float32 slices, norm with the residual and the slices' sum, gate/up with its SiLU product,
  down projection in slices. ``today`` is the sampler's mix (cuBLAS q/k/v, cuBLAS batched
  split-K products); ``triton`` is Triton throughout; ``triton_pdl`` adds PDL (released after
  each loop). The norms and the gate/up kernel (the sampler's tile, `GATE_UP_TILE`) are Triton
  in all three.
- ``down_sweep``: the Triton split-K down projection over slice counts and tiles against
  cuBLAS's batched product, for ``--sweep_seconds`` at most.

``--check`` runs each kernel once against torch at small float32 shapes instead (on CPU in
Triton's interpreter, ``TRITON_INTERPRET=1``, as the test does; PDL and the L2 prefetch need a
GPU). Example (one H100, a few minutes)::

    python benchmarks/layer_chain.py --sections products chain layer down_sweep --output c.json
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import torch

from rlscope.sampling.backends import triton_layers
from rlscope.sampling.backends.decode_attention import launch_options
from rlscope.utils import environment_info

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_engine import SHAPES
from profile_engine import emit, graph_time_us

SECTIONS = ("products", "chain", "layer", "down_sweep")
PRODUCTS = ("qkv", "o", "gate_up", "down")
Tile = tuple[int, int, int, int, int]
TILES: tuple[Tile, ...] = ((64, 64, 64, 4, 3), (64, 32, 64, 4, 4), (64, 128, 64, 4, 3),
                           (128, 64, 64, 4, 3), (64, 64, 128, 4, 3), (64, 32, 128, 4, 3),
                           (128, 32, 64, 4, 4), (64, 64, 64, 4, 4), (128, 128, 64, 8, 3),
                           (128, 64, 128, 8, 3), (128, 64, 128, 4, 3))
"""``(BM, BN, BK, num_warps, num_stages)`` tried for each product; a tile that does not divide
the product's shape is skipped. Every block is a multiple of 32 and every ``BK`` of 64."""
GATE_UP_TILE: Tile = (64, 32, 64, 4, 4)
"""The gate/up + SiLU kernel's tile in ``layer``: the sampler's (`gate_up.TILE`)."""
CHAIN_MODES = ("cublas", "triton", "pdl", "pdl_early", "pdl_prefetch", "pdl_early_prefetch")
LAYER_MODES = ("today", "triton", "triton_pdl")


def log(msg: str) -> None:
    """A progress line on stderr (stdout holds the JSON)."""
    print(f"[layer_chain] {msg}", file=sys.stderr, flush=True)


def kernels() -> ModuleType:
    """`layer_chain_kernels`, imported on first use (after ``TRITON_INTERPRET`` is set)."""
    import layer_chain_kernels

    return layer_chain_kernels


def matmul(a: torch.Tensor, w: torch.Tensor, c: torch.Tensor, tile: Tile, pdl: bool = False,
           early: bool = False, prefetch: bool = False) -> None:
    """``c = a @ w.T`` with `matmul_kernel` (``tile`` must divide the shapes)."""
    bm, bn, bk, warps, stages = tile
    (M, K), N = a.shape, w.shape[0]
    kernels().matmul_kernel[(M // bm, N // bn)](
        a, w, c, M, N, K, a.stride(0), w.stride(0), c.stride(0), BM=bm, BN=bn, BK=bk, PDL=pdl,
        EARLY=early, PREFETCH=prefetch, LINES=1 << max(0, (K // 64 - 1).bit_length()),
        num_warps=warps, num_stages=stages, **launch_options(pdl))


def split_k(a: torch.Tensor, w: torch.Tensor, parts: torch.Tensor, tile: Tile,
            pdl: bool = False) -> None:
    """``parts[s] = a[:, slice s] @ w[:, slice s].T`` (float32) with `split_k_kernel`."""
    bm, bn, bk, warps, stages = tile
    S, M, N = parts.shape
    kernels().split_k_kernel[(M // bm, N // bn, S)](
        a, w, parts, M, N, a.shape[1], a.stride(0), w.stride(0), BM=bm, BN=bn, BK=bk, S=S,
        PDL=pdl, num_warps=warps, num_stages=stages, **launch_options(pdl))


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
        PDL=pdl, num_warps=warps, num_stages=stages, **launch_options(pdl))


NORM_ROWS = 4
"""Rows a program of `add_norm_kernel`."""


def add_norm(x: torch.Tensor, parts: torch.Tensor, g: torch.Tensor, h: torch.Tensor,
             pdl: bool = False) -> None:
    """``x += parts.sum(0)``; ``h = rmsnorm(x) * g``: the sampler's kernel
    (`triton_layers.add_norm`), `NORM_ROWS` rows a program."""
    triton_layers.add_norm(x, parts, None, g, h, 1e-6, pdl, NORM_ROWS)


def fits(tile: Tile, M: int, N: int, K: int) -> bool:
    """Whether ``tile`` divides an ``M x N`` product over ``K`` (the kernels have no masks)."""
    return M % tile[0] == 0 and N % tile[1] == 0 and K % tile[2] == 0


class Layers:
    """``layers`` layers' random bf16 weights of one model shape and the random buffers a
    chain writes (each product reads the one ahead's output)."""

    def __init__(self, shape: dict[str, Any], rows: int, layers: int, split: int,
                 device: torch.device, dtype: torch.dtype = torch.bfloat16) -> None:
        D, inter = shape["hidden_size"], shape["intermediate_size"]
        X = (shape["num_attention_heads"] + 2 * shape["num_key_value_heads"]) \
            * (D // shape["num_attention_heads"])
        g = torch.Generator(device=device).manual_seed(0)

        def rand(*size: int, scale: float = 1.0, like: torch.dtype = dtype) -> torch.Tensor:
            return (torch.randn(*size, device=device, generator=g) * scale).to(like)

        self.M, self.D, self.X, self.inter, self.split = rows, D, X, inter, split
        self.w = [{"qkv": rand(X, D, scale=D ** -0.5), "o": rand(D, D, scale=D ** -0.5),
                   "gate_up": rand(2 * inter, D, scale=D ** -0.5),
                   "down": rand(D, inter, scale=inter ** -0.5)} for _ in range(layers)]
        self.norm_g = torch.ones(D, device=device)
        self.x = rand(rows, D, like=torch.float32)
        """The float32 residual stream (``layer``)."""
        self.start = rand(rows, D)
        """What a chain's first product reads, copied in at the start of each replay."""
        self.out = {"qkv": rand(rows, X), "o": rand(rows, D), "gate_up": rand(rows, 2 * inter),
                    "down": rand(rows, D)}
        self.act = rand(rows, inter)
        """The gate/up + SiLU product (``layer``)."""
        self.h = rand(rows, D)
        self.parts = rand(split, rows, D, like=torch.float32)

    def input(self, name: str) -> torch.Tensor:
        """The input each product reads: the output of the one ahead (q/k/v's first ``D``
        columns stand in for the attention output, the gate/up product's first ``I`` columns
        for the SiLU product)."""
        return {"qkv": self.out["down"], "o": self.out["qkv"][:, :self.D],
                "gate_up": self.out["o"], "down": self.out["gate_up"][:, :self.inter]}[name]

    def dims(self, name: str) -> tuple[int, int]:
        """``(N, K)`` of a product."""
        return {"qkv": (self.X, self.D), "o": (self.D, self.D), "gate_up": (2 * self.inter, self.D),
                "down": (self.D, self.inter)}[name]

    def product(self, i: int, name: str, mode: str, tile: Tile) -> None:
        """Layer ``i``'s product ``name``: cuBLAS, or Triton with the ``mode``'s PDL hooks."""
        a, w, c = self.input(name), self.w[i][name], self.out[name]
        if mode == "cublas":
            torch.mm(a, w.t(), out=c)
        else:
            matmul(a, w, c, tile, pdl=mode.startswith("pdl"), early="early" in mode,
                   prefetch="prefetch" in mode)

    def chain_of(self, i: int, mode: str, tiles: dict[str, Tile]) -> None:
        """Layer ``i``'s four products in turn (layer 0 first copies in `start`)."""
        if i == 0:
            self.out["down"].copy_(self.start)
        for name in PRODUCTS:
            self.product(i, name, mode, tiles[name])

    def split_product_of(self, i: int, name: str, tile: Tile) -> None:
        """Layer ``i``'s product ``name`` as Triton split-K slices into ``parts``."""
        split_k(self.input(name), self.w[i][name], self.parts, tile)

    def down_split_of(self, i: int, parts: torch.Tensor, tile: Tile | None) -> None:
        """Layer ``i``'s down projection of `act` in ``len(parts)`` slices: cuBLAS's batched
        product (``tile`` None) or Triton's split-K kernel."""
        if tile is None:
            split_k_bmm(self.act, self.w[i]["down"], parts)
        else:
            split_k(self.act, self.w[i]["down"], parts, tile)


def time_us(fn: Callable[[], Any], layers: int, iters: int) -> float:
    """µs a layer of ``fn`` (all layers) replayed from a CUDA graph."""
    return round(graph_time_us(fn, iters=iters) / layers, 2)


def each_layer(layers: int, call: Callable[..., None], *args: Any) -> Callable[[], None]:
    """A function running ``call(i, *args)`` for every layer ``i`` (what a graph replays)."""
    def f() -> None:
        for i in range(layers):
            call(i, *args)
    return f


def fitting(net: Layers, name: str, split: int = 1) -> list[Tile]:
    """The tiles of `TILES` that divide product ``name`` (its input in ``split`` slices)."""
    N, K = net.dims(name)
    return [t for t in TILES if fits(t, net.M, N, K // split)]


def best_tiles(net: Layers, names: tuple[str, ...], iters: int) -> dict[str, Any]:
    """Products ``names`` alone: cuBLAS, and every fitting tile of `TILES` in Triton."""
    out: dict[str, Any] = {}
    L = len(net.w)
    for name in names:
        times = {tile: time_us(each_layer(L, net.product, name, "triton", tile), L, iters)
                 for tile in fitting(net, name)}
        best = min(times, key=lambda t: times[t])
        cublas = time_us(each_layer(L, net.product, name, "cublas", best), L, iters)
        out[name] = {"cublas_us": cublas, "triton_us": times[best], "tile": list(best),
                     "tiles_us": {str(list(t)): v for t, v in times.items()}}
        log(f"{name}: cuBLAS {cublas} µs, Triton {times[best]} µs ({best})")
    return out


def run_chain(net: Layers, tiles: dict[str, Tile], iters: int, repeats: int) -> dict[str, Any]:
    """Every `CHAIN_MODES` mode of the four-product chain, ``repeats`` passes in turn."""
    L = len(net.w)
    res: dict[str, list[float]] = {m: [] for m in CHAIN_MODES}
    for _ in range(repeats):
        for mode in CHAIN_MODES:
            res[mode].append(time_us(each_layer(L, net.chain_of, mode, tiles), L, iters))
    log(f"chain (µs a layer): {res}")
    return {"us_a_layer": res}


def run_layer(net: Layers, qkv_tile: Tile, iters: int, repeats: int) -> dict[str, Any]:
    """Every `LAYER_MODES` mode of the six-kernel layer, ``repeats`` passes in turn (the split
    products' tiles: the fastest fitting ones, found first)."""
    L = len(net.w)
    tiles: dict[str, Tile] = {}
    for name in ("o", "down"):
        times = {t: time_us(each_layer(L, net.split_product_of, name, t), L, iters)
                 for t in fitting(net, name, net.split)}
        tiles[name] = min(times, key=lambda t: times[t])

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
                gate_up_silu(net.h, w["gate_up"], net.act, GATE_UP_TILE, pdl)
                if mode == "today":
                    split_k_bmm(net.act, w["down"], net.parts)
                else:
                    split_k(net.act, w["down"], net.parts, tiles["down"], pdl)
        return f

    res: dict[str, list[float]] = {m: [] for m in LAYER_MODES}
    for _ in range(repeats):
        for mode in LAYER_MODES:
            net.x.normal_()
            res[mode].append(time_us(layer(mode), L, iters))
    log(f"layer (µs a layer): {res}")
    return {"us_a_layer": res, "split_tiles": {k: list(v) for k, v in tiles.items()}}


def run_down_sweep(net: Layers, iters: int, seconds: float) -> dict[str, Any]:
    """The down projection in 4, 6 or 8 float32 slices: cuBLAS's batched product, and Triton's
    split-K kernel over a grid of tiles, until ``seconds`` have passed."""
    L = len(net.w)
    out: dict[str, Any] = {"cublas_us": {}, "triton_us": {}, "stopped_early": False}
    t0 = time.perf_counter()
    grid = list(itertools.product((64, 128), (32, 64, 128), (64, 128), (4, 8), (3, 4, 5)))
    for S in (4, 6, 8):
        if net.inter % S or out["stopped_early"]:
            continue
        parts = torch.zeros(S, net.M, net.D, device=net.x.device)
        out["cublas_us"][S] = time_us(each_layer(L, net.down_split_of, parts, None), L, iters)
        for tile in grid:
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


def shape_errors(net: Layers, sections: list[str]) -> list[str]:
    """What in the flags leaves a product without a fitting tile, said as what to change."""
    errors = []
    if net.M % 64:
        errors.append(f"--rows must be a multiple of 64 (the tiles' rows; got {net.M})")
        return errors
    for name in PRODUCTS:
        if not fitting(net, name):
            errors.append(f"no tile of TILES divides the {name} product "
                          f"({net.M} x {net.dims(name)[0]} x {net.dims(name)[1]})")
    if {"layer", "down_sweep"} & set(sections):
        for name in ("o", "down"):
            if net.dims(name)[1] % (64 * net.split):
                errors.append(f"--split {net.split}: the {name} product's input "
                              f"({net.dims(name)[1]}) must split into slices that are "
                              f"multiples of 64; choose a --split that divides "
                              f"{net.dims(name)[1] // 64}")
    if "layer" in sections and not fits(GATE_UP_TILE, net.M, net.inter, net.D):
        errors.append(f"the gate/up tile {GATE_UP_TILE} does not divide {net.M} x {net.inter}"
                      f" x {net.D}")
    return errors


def parser() -> argparse.ArgumentParser:
    """The command line (``--help`` lists every option with its default)."""
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    a = p.add_argument
    a("--sections", nargs="+", default=["products", "chain", "layer"], choices=SECTIONS,
      help="what to measure (see the module docstring)")
    a("--model", default="104m", choices=[k for k in SHAPES if k != "tiny"],
      help="model shape whose layer is measured (hf_engine.SHAPES)")
    a("--rows", type=int, default=256, help="rows a product (the sampler's batch)")
    a("--layers", type=int, default=12, help="layers, each with its own weights, a replay")
    a("--split", type=int, default=4,
      help="float32 slices of the split-K products (layer, down_sweep; qwen0.5b: 2)")
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
        errors = shape_errors(net, args.sections)
        if errors:
            p.error("; ".join(errors))
        res = {"benchmark": "layer_chain", "config": vars(args),
               "card": torch.cuda.get_device_name()}
        wanted = PRODUCTS if {"products", "chain"} & set(args.sections) else \
            ("qkv",) if "layer" in args.sections else ()
        found = best_tiles(net, wanted, args.iters)
        tiles = {k: cast(Tile, tuple(v["tile"])) for k, v in found.items()}
        if "products" in args.sections:
            res["products"] = found
        if "chain" in args.sections:
            res["chain"] = run_chain(net, tiles, args.iters, args.repeats)
        if "layer" in args.sections:
            res["layer"] = run_layer(net, tiles["qkv"], args.iters, args.repeats)
        if "down_sweep" in args.sections:
            res["down_sweep"] = run_down_sweep(net, args.iters, args.sweep_seconds)
    res["environment"] = environment_info(torch.device("cuda" if torch.cuda.is_available()
                                                       else "cpu"))
    emit(res, args.output)
    return res


if __name__ == "__main__":
    main()
