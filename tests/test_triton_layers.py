"""`rlscope.sampling.backends.triton_layers`: the decode layers as Triton kernels only.

On CPU the kernels run in Triton's interpreter (float32: its bf16 products are unreliable),
against torch and, in the static sampler, against the eager path and the step's own layers.
The bf16 and PDL checks on a GPU are in tests/test_gpu.py."""

from __future__ import annotations

import pytest
import torch

from rlscope.policy.hf import HFPolicy, tiny_hf_model
from rlscope.sampling.backends import hf_static, triton_layers
from tests.test_sampling_backends import _interpreted

_KERNELS = """
import torch
import torch.nn.functional as F
from rlscope.sampling.backends import triton_layers as tl_

g = torch.Generator().manual_seed(0)


def rnd(*shape):
    return torch.randn(*shape, generator=g)


def close(got, want):
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)


# tails in the rows (70, 3), the columns (80: 2.5 tiles of 32) and whole input blocks
for M, N, K in ((70, 80, 128), (3, 32, 64)):
    tile = (64, 32, 32, 4, 2)
    a, w, b = rnd(M, K), rnd(N, K), rnd(N)
    for bias in (b, None):
        out = torch.full((M, N), float("nan"))
        tl_.linear(a, w, bias, out, tile)
        close(out, F.linear(a, w, bias))
    for S in (1, 2, 4, 3):
        parts = torch.full((S, M, N), float("nan"))
        if K % (S * tile[2]):  # slices that are not whole blocks are refused
            try:
                tl_.split_k(a, w, parts, tile)
            except ValueError as e:
                assert "not whole blocks of 32" in str(e)
                continue
            raise AssertionError(f"split_k accepted {S} slices of {K}")
        tl_.split_k(a, w, parts, tile)
        width = K // S
        close(parts, torch.stack([a[:, s * width:(s + 1) * width]
                                  @ w[:, s * width:(s + 1) * width].T for s in range(S)]))
    # gate/up: the last gate tile reaches into the up rows, the last up tile past the weight
    inter = N
    w_gu = rnd(2 * inter, K) * 0.1
    act = torch.full((M, inter), float("nan"))
    tl_.gate_up_silu(a, w_gu, act, tile)
    gate, up = F.linear(a, w_gu).split(inter, -1)
    close(act, F.silu(gate) * up)
    # the residual plus the slices (and a bias), then RMSNorm; and the norm alone
    parts = torch.randn(2, M, N, generator=g)
    x0, gain = rnd(M, N), rnd(N)
    for parts_, bias in ((parts, b), (parts, None), (None, None)):
        x, h = x0.clone(), torch.full((M, N), float("nan"))
        tl_.add_norm(x, parts_, bias, gain, h, 1e-6)
        want = x0 if parts_ is None else x0 + (parts_.sum(0) + (0 if bias is None else bias))
        close(x, want)
        close(h, F.rms_norm(want, (N,), gain, 1e-6))
# a slice of wider rows is a TMA operand (16-byte aligned rows); a transposed weight and a
# strided residual are refused
wide = rnd(7, 96)
out = torch.empty(7, 32)
w32 = rnd(32, 64)
tl_.linear(wide[:, :64], w32, None, out, (64, 32, 32, 4, 2))
close(out, F.linear(wide[:, :64], w32))
for call in (lambda: tl_.linear(rnd(7, 64), rnd(64, 32).T, None, out, (64, 32, 32, 4, 2)),
             lambda: tl_.add_norm(rnd(64, 7).T, None, None, rnd(64), torch.empty(7, 64), 1e-6)):
    try:
        call()
    except ValueError as e:
        assert "contiguous" in str(e), e
    else:
        raise AssertionError("accepted a strided operand")
print("layer kernels ok")
"""

_SAMPLER = """
import dataclasses, torch
from rlscope.sampling import generate
from rlscope.sampling.backends import hf_static, triton_layers
from rlscope.sampling.draw import SamplingConfig
import tests.test_sampling_backends as t

hf_static.decode_attention_kind = lambda *a: "triton"
triton_layers.ON_CPU = True
# the tiny models' widths (64, 128) take smaller tiles than the defaults
DEFAULT_TILES = dict(triton_layers.TILES)
triton_layers.TILES = {k: (32, 32, 16, 4, 2) for k in triton_layers.TILES}
calls = []
plain = triton_layers.run
hf_static._run_triton_layers = lambda *a: calls.append(1) or plain(*a)
for arch in ("qwen2", "llama"):  # q/k/v biases, none
    policy = t._policy(arch)
    cfg = SamplingConfig(stop_token_ids=t.STOPS)
    prompts, seeds_B, group_B = t._prompts(groups=3, group_size=3)
    outs = []
    for backend, on in (("eager", False), ("static", False), ("static", True)):
        hf_static._DECODERS.clear()
        hf_static.TRITON_LAYERS = on
        before = len(calls)
        outs.append(generate(policy, prompts, dataclasses.replace(cfg, backend=backend),
                             seeds_B, 14, group_id_B=group_B, with_entropy=True,
                             with_sum_p2=True))
        assert (len(calls) - before == 13) == on  # every decode position, only when on
    assert bool(outs[2].finished_by_stop_B.any())
    t._assert_same(outs[0], outs[2])
    t._assert_same(outs[1], outs[2])
# the default tiles, at a width they fit (hidden 256, head dim 64, MLP 512)
from rlscope.policy.hf import HFPolicy, tiny_hf_model

triton_layers.TILES = dict(DEFAULT_TILES)
policy = HFPolicy(tiny_hf_model("qwen2", t.VOCAB, seed=0, hidden_size=256, num_heads=4))
outs = []
for on in (False, True):
    hf_static._DECODERS.clear()
    hf_static.TRITON_LAYERS = on
    outs.append(generate(policy, prompts, SamplingConfig(stop_token_ids=t.STOPS, backend="static"),
                         seeds_B, 6, group_id_B=group_B, with_entropy=True, with_sum_p2=True))
weights = next(iter(hf_static._DECODERS[policy][2].values())).weights
assert weights.layer_plan(weights.device).tiles == tuple(sorted(DEFAULT_TILES.items()))
t._assert_same(outs[0], outs[1])
print("triton layers sampler ok")
"""


_NO_HOOKS = """
import sys, types
import triton.language.extra.cuda as cuda

hidden = types.ModuleType(cuda.__name__)  # a Triton without the PDL hooks
hidden.__dict__.update({k: v for k, v in vars(cuda).items()
                        if k not in ("gdc_wait", "gdc_launch_dependents")})
sys.modules[cuda.__name__] = hidden
import torch
import torch.nn.functional as F
from rlscope.sampling.backends import layer_kernels, decode_kernels
from rlscope.sampling.backends import triton_layers as tl_

for module in (layer_kernels, decode_kernels):  # the stand-ins of decode_kernels
    for name in ("gdc_wait", "gdc_launch_dependents"):
        assert getattr(module, name).fn.__module__ == decode_kernels.__name__, (module, name)
a, w = torch.randn(5, 64), torch.randn(32, 64)
out = torch.empty(5, 32)
tl_.linear(a, w, None, out, (64, 32, 32, 4, 2))
torch.testing.assert_close(out, F.linear(a, w), atol=1e-4, rtol=1e-5)
print("no hooks ok")
"""


def test_kernels_load_without_pdl_hooks() -> None:
    """With a Triton that lacks ``gdc_wait``/``gdc_launch_dependents``, the kernel modules
    still import (no-op stand-ins that only a PDL launch would reach) and the kernels run."""
    assert "no hooks ok" in _interpreted(_NO_HOOKS)


def test_layer_kernels_in_the_interpreter() -> None:
    """Each kernel against torch in float32, with tails in the rows and columns: the q/k/v
    product with and without its bias, the split-K product over 1, 2 and 4 slices (3, which
    are not whole blocks, refused), the gate/up
    product with its SiLU product (whose last gate tile reads into the up rows), and the
    residual add of the slices (with and without a bias) with RMSNorm, and the norm alone; a
    slice of wider rows read through TMA, and strided operands refused."""
    assert "layer kernels ok" in _interpreted(_KERNELS)


def test_triton_layers_in_the_static_sampler_in_the_interpreter() -> None:
    """The static sampler with `hf_static.TRITON_LAYERS` gives the eager path's tokens and
    log-probs, and the step's own layers', to 1e-5 (float32, ragged grouped prompts, stops;
    Qwen2 with q/k/v biases and Llama without), and runs every decode position's layers
    through `triton_layers.run` (and none when off); with the default tiles at hidden 256,
    the same as the step's own layers."""
    assert "triton layers sampler ok" in _interpreted(_SAMPLER)


def _weights(arch: str = "qwen2", dtype: torch.dtype = torch.float32,
             **shape: int) -> hf_static.HFStaticWeights:
    policy = HFPolicy(tiny_hf_model(arch, 40, seed=0, **shape))
    return hf_static.HFStaticWeights(policy.unwrap(), dtype)


def test_plan_applies_only_where_it_should(monkeypatch: pytest.MonkeyPatch) -> None:
    """`triton_layers.plan`: None on a CPU outside the interpreter, for a half residual
    stream, for q/k norms, and for widths no tile fits; otherwise the most split-K slices (at
    most those asked) whose slices are whole blocks, with the tiles and norm rows as planned."""
    pytest.importorskip("triton")
    cpu = torch.device("cpu")
    small = {k: (32, 32, 16, 4, 2) for k in triton_layers.TILES}
    monkeypatch.setattr(triton_layers, "TILES", small)
    w = _weights()  # hidden 64, MLP 128
    assert triton_layers.plan(w, cpu) is None  # not the interpreter: CPU is refused
    monkeypatch.setattr(triton_layers, "ON_CPU", True)
    monkeypatch.setattr(triton_layers, "SPLIT_OUT", 4)
    monkeypatch.setattr(triton_layers, "SPLIT_DOWN", 2)
    got = triton_layers.plan(w, cpu)
    assert got is not None and (got.split_out, got.split_down, got.pdl) == (4, 2, False)
    assert got.tile("down") == small["down"] and got.norm_rows == triton_layers.NORM_ROWS
    # 64 / 16 = 4 blocks: 3 slices would not be whole blocks, 2 are; 128 / 16 = 8 blocks:
    # 16 asked -> 8
    monkeypatch.setattr(triton_layers, "SPLIT_OUT", 3)
    monkeypatch.setattr(triton_layers, "SPLIT_DOWN", 16)
    got = triton_layers.plan(w, cpu)
    assert got is not None and (got.split_out, got.split_down) == (2, 8)
    half_resid = _weights()
    half_resid.resid_dtype = torch.bfloat16
    assert triton_layers.plan(half_resid, cpu) is None
    qk_norm = _weights()
    qk_norm.qk_norm = True
    assert triton_layers.plan(qk_norm, cpu) is None
    monkeypatch.setattr(triton_layers, "TILES", {k: (32, 32, 128, 4, 2)
                                                 for k in triton_layers.TILES})
    assert triton_layers.plan(w, cpu) is None  # 64 wide: no 128-wide input block
    assert triton_layers._slices(896, 4, 64) == 2  # the 0.5B's output projection
    assert triton_layers._slices(4864, 2, 128) == 2  # and its down projection
    assert triton_layers._slices(100, 4, 64) == 0
    assert not triton_layers.supports_pdl(cpu)


def test_plan_on_cuda_needs_hopper_and_its_shared_memory(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """On CUDA (the device's properties stood in for, no GPU needed): a plan only for a half
    sampling dtype on compute capability 9.0 or later whose shared memory a block holds every
    product's pipeline (the default tiles need ~192 KiB: an H100's 227 KiB do, a compute
    capability 12 card's ~99 KiB do not)."""
    pytest.importorskip("triton")
    import types

    cuda = torch.device("cuda")
    card = {"cap": (9, 0), "smem": 232_448}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: card["cap"])
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: types.SimpleNamespace(
        shared_memory_per_block_optin=card["smem"]))
    wide = _weights(dtype=torch.bfloat16, hidden_size=256, num_heads=4)  # the default tiles fit
    got = triton_layers.plan(wide, cuda)
    assert got is not None and got.tiles == tuple(sorted(triton_layers.TILES.items()))
    assert got.pdl == triton_layers.supports_pdl(cuda)
    assert triton_layers.plan(_weights(dtype=torch.float32, hidden_size=256, num_heads=4),
                              cuda) is None
    card["smem"] = 101_376  # compute capability 12.0
    card["cap"] = (12, 0)
    assert triton_layers.plan(wide, cuda) is None
    card["cap"], card["smem"] = (8, 0), 232_448  # an A100: no TMA path
    assert triton_layers.plan(wide, cuda) is None
    down = triton_layers.TILES["down"]
    assert triton_layers._smem_bytes(down, 1, 2) == 6 * (64 + 64) * 128 * 2 + 1024


def test_layer_plan_follows_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """`HFStaticWeights.layer_plan`: None with `hf_static.TRITON_LAYERS` off; on, the plan of
    `triton_layers`' settings, made afresh when a setting changes (never a stale one)."""
    pytest.importorskip("triton")
    cpu = torch.device("cpu")
    monkeypatch.setattr(triton_layers, "ON_CPU", True)
    monkeypatch.setattr(triton_layers, "TILES", {k: (32, 32, 16, 4, 2)
                                                 for k in triton_layers.TILES})
    w = _weights()
    monkeypatch.setattr(hf_static, "TRITON_LAYERS", False)
    assert w.layer_plan(cpu) is None
    monkeypatch.setattr(hf_static, "TRITON_LAYERS", True)
    first = w.layer_plan(cpu)
    assert first is not None and first.split_down == min(triton_layers.SPLIT_DOWN, 8)
    monkeypatch.setattr(triton_layers, "SPLIT_DOWN", 1)
    got = w.layer_plan(cpu)
    assert got is not None and got.split_down == 1
    monkeypatch.setattr(triton_layers, "TILES", {**triton_layers.TILES,
                                                 "down": (32, 32, 32, 4, 3)})
    got = w.layer_plan(cpu)
    assert got is not None and got.tile("down") == (32, 32, 32, 4, 3)
    monkeypatch.setattr(triton_layers, "NORM_ROWS", 2)
    got = w.layer_plan(cpu)
    assert got is not None and got.norm_rows == 2


def test_kernels_compile_for_hopper_with_tma_and_pdl() -> None:
    """Each kernel compiled ahead of time for sm_90 (no GPU needed): the products load through
    TMA (``cp.async.bulk.tensor``) into tensor-core products (``wgmma``); with ``PDL`` every
    kernel, the attention kernel included, waits on the grid ahead and releases the next one,
    and without it neither."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget

    from rlscope.sampling.backends import decode_kernels, layer_kernels

    def ptx(fn: object, types: dict[str, str], **const: object) -> str:
        names = fn.arg_names  # type: ignore[attr-defined]
        sig = {n: "constexpr" if n in const else types.get(n, "i32") for n in names}
        src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=const)
        try:
            return str(triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"])
        except RuntimeError as exc:  # a Triton build without the CUDA toolchain
            pytest.skip(f"cannot compile for sm_90 here: {exc}")

    def desc(rows: int, cols: int) -> str:
        return f"tensordesc<bf16[{rows}, {cols}]>"

    def kernels(pdl: bool) -> dict[str, str]:
        return {
            "linear": ptx(layer_kernels.linear_kernel,
                          {"a_desc": desc(64, 128), "w_desc": desc(64, 128),
                           "bias_ptr": "*bf16", "c_ptr": "*bf16"},
                          BM=64, BN=64, BK=128, STAGES=4, HAS_BIAS=True, PDL=pdl),
            "split_k": ptx(layer_kernels.split_k_kernel,
                           {"a_desc": desc(64, 128), "w_desc": desc(64, 128),
                            "parts_ptr": "*fp32"},
                           BM=64, BN=64, BK=128, S=2, STAGES=6, PDL=pdl),
            "gate_up_silu": ptx(layer_kernels.gate_up_silu_kernel,
                                {"x_desc": desc(64, 64), "w_desc": desc(32, 64),
                                 "out_ptr": "*bf16"},
                                BM=64, BN=32, BK=64, STAGES=4, PDL=pdl),
            "add_norm": ptx(layer_kernels.add_norm_kernel,
                            {"x_ptr": "*fp32", "parts_ptr": "*fp32", "bias_ptr": "*bf16",
                             "g_ptr": "*fp32", "h_ptr": "*bf16", "eps": "fp32"},
                            N=768, S=2, HAS_BIAS=False, ROWS=1, BN=1024, PDL=pdl),
            "attention": ptx(decode_kernels.decode_attention_rope_kernel,
                             {"qkv_ptr": "*bf16", "cos_ptr": "*fp32", "sin_ptr": "*fp32",
                              "rope_row_ptr": "*i64", "k_ptr": "*bf16", "v_ptr": "*bf16",
                              "o_ptr": "*bf16", "col_ptr": "*i64", "src_ptr": "*i32",
                              "start_ptr": "*i32", "used_ptr": "*i32", "scale": "fp32"},
                             H=12, KV=4, GROUP=3, BLOCK_G=16, BLOCK=32, D=64, PDL=pdl),
        }

    with_pdl, plain = kernels(True), kernels(False)
    for name in ("linear", "split_k", "gate_up_silu"):
        assert "cp.async.bulk.tensor" in with_pdl[name] and "wgmma" in with_pdl[name], name
    for name, code in with_pdl.items():
        assert "griddepcontrol.wait" in code, name
        assert "griddepcontrol.launch_dependents" in code, name
        assert "griddepcontrol" not in plain[name], name


@pytest.mark.parametrize("name,value,message", [
    ("NORM_ROWS", 3, "NORM_ROWS must be a power of two"),
    ("NORM_ROWS", 0, "NORM_ROWS must be a power of two"),
    ("SPLIT_DOWN", 0, "SPLIT_DOWN must be an integer >= 1"),
    ("TILES", {"qkv": (64, 64, 128, 4, 4)}, "needs the tiles of qkv, out, gate_up and down"),
    ("TILES", {"qkv": (64, 48, 128, 4, 4), "out": (64, 64, 64, 4, 3),
               "gate_up": (64, 32, 64, 4, 4), "down": (64, 64, 128, 4, 6)},
     "TILES['qkv'] must be"),
])
def test_settings_no_kernel_can_run_are_refused(monkeypatch: pytest.MonkeyPatch, name: str,
                                                 value: object, message: str) -> None:
    """Settings a variant may set from outside (a non-power-of-two norm row count, no slices,
    a missing or odd tile) are refused before anything is launched, saying what to change;
    the defaults pass."""
    assert triton_layers.setting_errors() == []
    monkeypatch.setattr(triton_layers, name, value)
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")):
        triton_layers.plan(_weights(), torch.device("cpu"))
