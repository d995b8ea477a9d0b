"""The ``static`` generation backend: rlscope's own decode step over a Hugging Face model's weights.

For decoder-only Llama, Qwen2, Qwen3 and Mistral models (``config.model_type``) this backend
samples without calling the model's ``forward``: it keeps its own copy of the weights in the
sampling dtype (bf16 under ``--autocast bf16`` on CUDA, else the model's dtype), fused where
that saves kernels (q/k/v in one matrix, gate/up in one), and runs

- **prefill** once per group of rows sharing a prompt (the group's first row; its keys and
  values are then copied to every row of the group), eagerly, with SDPA under a causal +
  left-padding mask;
- **decode** one position at a time against a preallocated static KV cache
  ``[B, max_len, kv_heads, head_dim]`` per layer, attending (`DecodeKeys`) with a Triton
  kernel or torch's flash kernel over each row's written keys only (bf16/fp16 on CUDA,
  left-padded prompts), else with SDPA under an additive key mask ``[B, kv_heads, max_len]``
  (left padding masked; each generated position unmasked as it is written); either way the
  ``group`` query heads of each kv head are ``group`` query rows of one head (no repeated
  keys), RoPE from the model's own
  ``model.model.rotary_emb`` (so its rope-scaling variant is the model's), positions from the
  mask (the package's convention);
- **sampling** by `rlscope.sampling.draw.draw` with the step's counter-based Gumbel noise
  computed on the device (``gumbel_offsets(seeds_B, step, V)``; never ``[B, T, V]``), the
  alive mask updated on the device, and the host checking "all finished" only every
  ``SamplingConfig.stop_check_every`` positions; the output is trimmed to the last position any
  row was alive at, so the rollout has the eager path's length.

On CUDA the decode step (model, draw, bookkeeping) is captured in a CUDA graph per bucket:
rows rounded up to a power of two (at least `MIN_ROWS`; pad rows repeat row 0 and are
discarded) and the prompt left-padded to a multiple of `PROMPT_MULTIPLE` (extra left padding is
neutral because positions come from the mask), so batches of varying size reuse graphs.

The weights are refreshed in place (same storage, so captured graphs stay valid) whenever an
optimizer stepped (a global ``torch.optim`` post-step hook: fused AdamW does not bump version
counters) or a source parameter's version counter or address moved (``load_state_dict``, any
in-place autograd-visible write); `weights_changed` covers writes through ``.data``. The time
it takes accumulates for `take_weight_sync_seconds` (``time/sampler_weight_sync``).

Anything else (other architectures, PEFT/LoRA adapters, biased MLPs, non-SiLU activations,
replaced modules, a dynamic/longrope RoPE, a sliding window shorter than the sequence) is
unsupported: `unsupported_reason` says why, and ``--backend auto`` falls back to the
eager path.

Use directly (e.g. in a benchmark)::

    from rlscope.sampling.backends import BACKENDS
    rollout = BACKENDS["static"].generate(hf_policy, prompts, SamplingConfig(), seeds_B, 128)
"""

from __future__ import annotations

import dataclasses
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from rlscope.batch import PromptBatch, RolloutBatch
from rlscope.policy.base import Policy, position_ids_from_mask
from rlscope.sampling.backends import decode_attention, fused_draw, gate_up, triton_layers
from rlscope.sampling.backends.eager import generate_eager
from rlscope.sampling.draw import SamplingConfig, assemble, draw
from rlscope.sampling.graphs import capture, record_draw
from rlscope.sampling.processors import column_keys, gumbel_offsets_at

SUPPORTED_MODEL_TYPES: tuple[str, ...] = ("llama", "qwen2", "qwen3", "mistral")
"""``config.model_type`` values the static decoder implements."""
SUPPORTED_ROPE_TYPES: tuple[str, ...] = ("default", "linear", "llama3", "yarn")
"""RoPE variants whose ``rotary_emb`` never reads the positions on the host (graph-safe)."""
MIN_ROWS = 8
"""Smallest row bucket."""
PROMPT_MULTIPLE = 16
"""Prompts are left-padded to a multiple of this many positions."""
MAX_BUCKETS = 8
"""Buckets (caches and graphs) kept per policy; the oldest is dropped beyond this."""


class _SyncClock:
    """Seconds spent refreshing the sampler's weights since the last `take`."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def take(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds


_CLOCK = _SyncClock()


class _StepCounter:
    """Optimizer steps taken anywhere in the process (a global post-step hook, registered
    when the first `HFStaticWeights` is built). Fused AdamW (the loop's optimizer) updates
    parameters without bumping their version counters, so the version stamp alone would miss
    it."""

    def __init__(self) -> None:
        self.count = 0
        self.hooked = False

    def hook(self) -> None:
        if not self.hooked:
            register_optimizer_step_post_hook(self._bump)
            self.hooked = True

    def _bump(self, *_: Any) -> None:
        self.count += 1


_STEPS = _StepCounter()


def weights_changed() -> None:
    """Tell the static sampler that parameters changed outside ``torch.optim`` and outside
    autograd's version counters (e.g. written through ``.data``): its next call refreshes."""
    _STEPS.count += 1


def take_weight_sync_seconds() -> float:
    """Seconds the static backend spent copying the learner's weights into its own since the
    last call (0 when it never ran); the loop logs it as ``time/sampler_weight_sync``."""
    return _CLOCK.take()


def _linear(module: Any) -> bool:
    return type(module) is nn.Linear


def unsupported_reason(policy: Policy) -> str | None:
    """Why the static decoder cannot run ``policy`` (None when it can)."""
    from rlscope.policy.hf import HFPolicy

    if not isinstance(policy, HFPolicy):
        return f"{type(policy).__name__} is not a Hugging Face policy"
    if policy.has_adapters:
        return "the model has PEFT/LoRA adapters (merge them or use the eager backend)"
    model = policy.unwrap()
    config = model.config
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return f"model_type {model_type!r} is not one of {SUPPORTED_MODEL_TYPES}"
    if getattr(config, "hidden_act", None) != "silu":
        return f"hidden_act {getattr(config, 'hidden_act', None)!r} is not 'silu'"
    if getattr(config, "mlp_bias", False):
        return "MLP biases (mlp_bias=True) are not implemented"
    base = getattr(model, "model", None)
    layers = getattr(base, "layers", None)
    if base is None or layers is None or not _linear(getattr(model, "lm_head", None)) \
            or not isinstance(getattr(base, "embed_tokens", None), nn.Embedding):
        return "the model does not have the standard model.layers / embed_tokens / lm_head"
    rope_type = getattr(getattr(base, "rotary_emb", None), "rope_type", None)
    if rope_type not in SUPPORTED_ROPE_TYPES:
        return f"RoPE type {rope_type!r} is not one of {SUPPORTED_ROPE_TYPES}"
    for i, layer in enumerate(layers):
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if not all(_linear(getattr(attn, n, None)) for n in ("q_proj", "k_proj", "v_proj",
                                                             "o_proj")) \
                or not all(_linear(getattr(mlp, n, None)) and getattr(mlp, n).bias is None
                           for n in ("gate_proj", "up_proj", "down_proj")):
            return f"layer {i} has non-standard attention or MLP modules"
        norms = ["input_layernorm", "post_attention_layernorm"]
        if model_type == "qwen3":
            norms = [*norms, "self_attn.q_norm", "self_attn.k_norm"]
        for name in norms:
            module: Any = layer
            for part in name.split("."):
                module = getattr(module, part, None)
            if not hasattr(module, "variance_epsilon") or type(module).__name__ not in (
                    "LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm"):
                return f"layer {i}'s {name} is not the architecture's RMSNorm"
    return None


def sliding_window(policy: Policy) -> int | None:
    """The model's attention window in positions (None: full attention in every layer)."""
    config = policy.unwrap().config  # type: ignore[attr-defined]
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and "sliding_attention" not in layer_types:
        return None
    return int(window) if window is not None else None


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Hugging Face's RMSNorm: normalise in float32, back to the input's dtype, times weight."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


class HFStaticWeights:
    """The sampler's copy of a Hugging Face model's weights, fused and in the sampling dtype.

    ``resid_dtype`` (the model's parameter dtype) carries the residual stream, the norms and
    RoPE, as Hugging Face does under autocast; matmuls run in ``dtype``. `refresh` copies the
    model's parameters in place when they changed."""

    def __init__(self, model: Any, dtype: torch.dtype) -> None:
        """``model``: a supported ``transformers`` causal LM (see `unsupported_reason`)."""
        config = model.config
        base = model.model
        self.layers_src: list[Any] = list(base.layers)
        self.rotary: nn.Module = base.rotary_emb
        self.qk_norm = config.model_type == "qwen3"
        self.n_heads: int = config.num_attention_heads
        self.n_kv: int = config.num_key_value_heads
        self.head_dim: int = getattr(config, "head_dim", None) or \
            config.hidden_size // self.n_heads
        self.scale = self.head_dim ** -0.5
        self.eps = float(config.rms_norm_eps)
        embed = base.embed_tokens.weight
        self.device = embed.device
        self.dtype = dtype
        self.resid_dtype = embed.dtype
        self.vocab_size = int(model.lm_head.weight.shape[0])
        self.intermediate = int(self.layers_src[0].mlp.gate_proj.weight.shape[0])
        self._pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._sources: list[torch.Tensor] = []

        def own(src: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
            dst = torch.empty(src.shape, dtype=dt, device=src.device)
            self._pairs.append((src, dst))
            return dst

        def fused(srcs: list[torch.Tensor | None], rows: list[int], dt: torch.dtype,
                  cols: int | None) -> torch.Tensor:
            shape = (sum(rows),) if cols is None else (sum(rows), cols)
            dst = torch.zeros(shape, dtype=dt, device=self.device)
            start = 0
            for src, n in zip(srcs, rows, strict=True):
                if src is not None:
                    self._pairs.append((src, dst[start:start + n]))
                start += n
            return dst

        self.embed = own(embed, self.resid_dtype)
        self.head = own(model.lm_head.weight, dtype)
        head_bias = model.lm_head.bias
        self.head_bias = own(head_bias, dtype) if head_bias is not None else None
        self.norm = own(base.norm.weight, self.resid_dtype)
        self.w_qkv: list[torch.Tensor] = []
        self.b_qkv: list[torch.Tensor | None] = []
        self.w_o: list[torch.Tensor] = []
        self.b_o: list[torch.Tensor | None] = []
        self.w_gu: list[torch.Tensor] = []
        self.w_down: list[torch.Tensor] = []
        self.ln1: list[torch.Tensor] = []
        self.ln2: list[torch.Tensor] = []
        self.q_norm: list[torch.Tensor] = []
        self.k_norm: list[torch.Tensor] = []
        D = int(embed.shape[1])
        for layer in self.layers_src:
            a, m = layer.self_attn, layer.mlp
            projs = [a.q_proj, a.k_proj, a.v_proj]
            rows = [int(p.weight.shape[0]) for p in projs]
            self.w_qkv.append(fused([p.weight for p in projs], rows, dtype, D))
            biases = [p.bias for p in projs]
            self.b_qkv.append(None if all(b is None for b in biases)
                              else fused(biases, rows, dtype, None))
            self.w_o.append(own(a.o_proj.weight, dtype))
            self.b_o.append(own(a.o_proj.bias, dtype) if a.o_proj.bias is not None else None)
            self.w_gu.append(fused([m.gate_proj.weight, m.up_proj.weight],
                                   [self.intermediate, self.intermediate], dtype, D))
            self.w_down.append(own(m.down_proj.weight, dtype))
            self.ln1.append(own(layer.input_layernorm.weight, self.resid_dtype))
            self.ln2.append(own(layer.post_attention_layernorm.weight, self.resid_dtype))
            if self.qk_norm:
                self.q_norm.append(own(a.q_norm.weight, self.resid_dtype))
                self.k_norm.append(own(a.k_norm.weight, self.resid_dtype))
        self._stamp: tuple[int, ...] | None = None
        self._triton_plans: dict[tuple[Any, ...], triton_layers.Plan | None] = {}
        _STEPS.hook()

    def stamp(self) -> tuple[int, ...]:
        """The process's optimizer-step count (`weights_changed` adds to it), and the version
        counters and addresses of the source parameters: read on the host, no device sync."""
        return (_STEPS.count,
                *(x for src, _ in self._pairs for x in (src._version, src.data_ptr())))

    def refresh(self) -> bool:
        """Copy the model's parameters in place if they changed since the last refresh; adds
        the time taken to `take_weight_sync_seconds`. Returns whether it copied."""
        stamp = self.stamp()
        if stamp == self._stamp:
            return False
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(self.device)  # time the copy alone, not pending work
        t0 = time.perf_counter()
        with torch.no_grad():
            for src, dst in self._pairs:
                dst.copy_(src)
        if cuda:
            torch.cuda.synchronize(self.device)
        _CLOCK.seconds += time.perf_counter() - t0
        self._stamp = stamp
        return True

    # ------------------------------------------------------------------ the model

    def _rope(self, x_NTD: torch.Tensor, pos_NT: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin')`` ``[N, T, 1, Dh]`` from the model's own ``rotary_emb``, once per
        forward (shared by every layer); ``sin'`` has its first half negated so that
        ``rotate_half(x) * sin == x.roll(Dh / 2) * sin'`` (one roll instead of neg + cat)."""
        cos_NTD, sin_NTD = self.rotary(x_NTD, pos_NT)
        half = self.head_dim // 2
        signed_NTD = torch.cat((-sin_NTD[..., :half], sin_NTD[..., half:]), -1)
        return cos_NTD[:, :, None], signed_NTD[:, :, None]

    def fuses_rope(self, attention: str) -> bool:
        """Whether the decode step rotates, writes the cache and attends in one kernel
        (`FUSE_ROPE`, the ``triton`` attention, no q/k norm), the kernel that reads
        `rope_table`."""
        return FUSE_ROPE and attention == "triton" and not self.qk_norm

    def rope_table(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`_rope`'s ``(cos, sin')`` of every position below ``length``, as ``[length, Dh]``
        tables. Computed as a decode step computes them (one position per row), so a row's
        entry is the value the step would compute at that position (`ROPE_TABLE`)."""
        pos_L1 = torch.arange(length, device=self.device)[:, None]
        x_L1D = torch.zeros(length, 1, 1, dtype=self.embed.dtype, device=self.device)
        cos_L11D, sin_L11D = self._rope(x_L1D, pos_L1)
        return (cos_L11D.reshape(length, self.head_dim).contiguous(),
                sin_L11D.reshape(length, self.head_dim).contiguous())

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """`_rms_norm`, fused into one kernel where input and weight share a dtype (the same
        arithmetic: float32 statistics, then times weight)."""
        if x.dtype == weight.dtype == torch.float32:
            return F.rms_norm(x, weight.shape, weight, self.eps)
        return _rms_norm(x, weight, self.eps)

    def _qkv(self, i: int, x_NTD: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Layer ``i``'s rotated queries ``[N, T, H, Dh]``, keys and values ``[N, T, K, Dh]``
        (sampling dtype) for the residual stream ``x_NTD``."""
        N, T, _ = x_NTD.shape
        H, K, Dh = self.n_heads, self.n_kv, self.head_dim
        h_NTD = self._norm(x_NTD, self.ln1[i]).to(self.dtype)
        qkv = F.linear(h_NTD, self.w_qkv[i], self.b_qkv[i])
        qk_NTJD = qkv[..., :(H + K) * Dh].view(N, T, H + K, Dh)  # J = H + K heads, rotated
        v_NTKD = qkv[..., (H + K) * Dh:].view(N, T, K, Dh)
        if self.qk_norm:
            qk_NTJD = torch.cat((_rms_norm(qk_NTJD[:, :, :H], self.q_norm[i], self.eps),
                                 _rms_norm(qk_NTJD[:, :, H:], self.k_norm[i], self.eps)), 2)
        cos, sin_signed = rope
        qk_NTJD = torch.addcmul(qk_NTJD * cos, qk_NTJD.roll(Dh // 2, -1), sin_signed) \
            .to(self.dtype)
        return qk_NTJD[:, :, :H], qk_NTJD[:, :, H:], v_NTKD

    def _finish_layer(self, i: int, x_NTD: torch.Tensor, attn_NTE: torch.Tensor,
                      split: int = 0, fuse_gate_up: bool = False, split_out: int = 0
                      ) -> torch.Tensor:
        """Residual + output projection, then the gated MLP block (``split`` and
        ``split_out``: the down and output projections as `split_k_linear` over that many
        slices; ``fuse_gate_up``: the gate/up and SiLU products as one kernel,
        `gate_up.gate_up_silu`)."""
        x_NTD = x_NTD + _project(attn_NTE, self.w_o[i], self.b_o[i], split_out)
        h_NTD = self._norm(x_NTD, self.ln2[i]).to(self.dtype)
        if fuse_gate_up:
            N, T, D = h_NTD.shape
            act_NTI = gate_up.gate_up_silu(h_NTD.reshape(N * T, D), self.w_gu[i]) \
                .view(N, T, self.intermediate)
        else:
            gate_NTI, up_NTI = F.linear(h_NTD, self.w_gu[i]).split(self.intermediate, -1)
            act_NTI = F.silu(gate_NTI).mul_(up_NTI)
        return x_NTD + _project(act_NTI, self.w_down[i], None, split)

    def _split_k(self, x: torch.Tensor, count: int, n_in: int) -> int:
        """``count`` split-K slices where they apply to a decode step's product of ``n_in``
        inputs (being compiled, on CUDA, half-precision matmuls, ``count`` dividing
        ``n_in``), else 0."""
        fits = x.device.type == "cuda" and self.dtype in (torch.float16, torch.bfloat16) \
            and count > 1 and n_in % count == 0
        return count if fits and torch.compiler.is_compiling() else 0

    def _split_down(self, x: torch.Tensor) -> int:
        """`SPLIT_K_DOWN` where it applies to a decode step (`_split_k`), else 0."""
        return self._split_k(x, SPLIT_K_DOWN, self.intermediate)

    def _split_out(self, x: torch.Tensor) -> int:
        """`SPLIT_K_OUT` where it applies to a decode step (`_split_k`), else 0."""
        return self._split_k(x, SPLIT_K_OUT, self.n_heads * self.head_dim)

    def fuses_gate_up(self, device: torch.device) -> bool:
        """Whether decode steps run the gate/up and SiLU products as one kernel
        (`FUSED_GATE_UP` and `gate_up.applies`)."""
        return FUSED_GATE_UP and gate_up.applies(device, self.dtype)

    def layer_plan(self, device: torch.device) -> triton_layers.Plan | None:
        """How the fused decode step runs its layers as Triton kernels with PDL
        (`TRITON_LAYERS`, `triton_layers.plan` from `triton_layers`' own settings), or None
        where it does not (the step's own layers then run). Kept per device and settings."""
        if not TRITON_LAYERS:
            return None
        key = (device, *triton_layers.settings())
        if key not in self._triton_plans:
            self._triton_plans[key] = triton_layers.plan(self, device)
        return self._triton_plans[key]

    def _logits(self, x_ND: torch.Tensor) -> torch.Tensor:
        """Next-token logits in the sampling dtype (the draw reads them in float32)."""
        h_ND = self._norm(x_ND, self.norm).to(self.dtype)
        return F.linear(h_ND, self.head, self.head_bias)

    def prefill(self, tokens_GP: torch.Tensor, mask_GP: torch.Tensor, rows_N: torch.Tensor,
                groups_N: torch.Tensor, k_cache: list[torch.Tensor], v_cache: list[torch.Tensor]
                ) -> torch.Tensor:
        """Run ``G`` left-padded prompts (``mask_GP`` bool, True on real tokens); write each
        layer's keys and values of prompt ``groups_N[j]`` to cache row ``rows_N[j]``, columns
        ``[0, P)``; return the next-token ``logits_GV``."""
        G, P = tokens_GP.shape
        pos_GP = position_ids_from_mask(mask_GP)
        causal_PP = torch.ones(P, P, dtype=torch.bool, device=tokens_GP.device).tril()
        # causal and not padding; every query also sees itself, so a padding query's row is
        # never empty (its output is unused but stays finite)
        allowed_G1PP = (causal_PP & mask_GP[:, None, None, :]) | \
            torch.eye(P, dtype=torch.bool, device=tokens_GP.device)
        x_GPD = self.embed[tokens_GP]
        rope = self._rope(x_GPD, pos_GP)
        for i in range(len(self.w_qkv)):
            q_GPHD, k_GPKD, v_GPKD = self._qkv(i, x_GPD, rope)
            k_cache[i][rows_N, :P] = k_GPKD.index_select(0, groups_N)
            v_cache[i][rows_N, :P] = v_GPKD.index_select(0, groups_N)
            k_GKPD, v_GKPD = k_GPKD.transpose(1, 2), v_GPKD.transpose(1, 2)
            o_GHPD = F.scaled_dot_product_attention(q_GPHD.transpose(1, 2), k_GKPD, v_GKPD,
                                                    attn_mask=allowed_G1PP, scale=self.scale,
                                                    enable_gqa=True)
            x_GPD = self._finish_layer(i, x_GPD, o_GHPD.transpose(1, 2).reshape(G, P, -1))
        return self._logits(x_GPD[:, -1])

    def decode(self, token_B: torch.Tensor, pos_B: torch.Tensor, col_1: torch.Tensor,
               keys: DecodeKeys, k_cache: list[torch.Tensor], v_cache: list[torch.Tensor],
               rope_table: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """One position per row, graph-safe: ``token_B`` at position ``pos_B`` is written to
        cache column ``col_1`` (a ``[1]`` device tensor) of the ``[B, L, K, Dh]`` caches and
        attends over the keys ``keys`` marks (`DecodeKeys`: an additive mask over the whole
        cache, or a kernel over each row's written columns); returns the next
        ``logits_BV``. ``rope_table`` (`rope_table`, covering every position of ``pos_B``):
        the fused step reads each row's rotation from it instead of computing it."""
        keys.advance(col_1)
        x_B1D = self.embed.index_select(0, token_B)[:, None]
        if self.fuses_rope(keys.kind):
            rows_B = pos_B  # a table of every position: row b reads its position's entry
            if rope_table is None:  # this step's rotations: row b reads entry b
                B = x_B1D.shape[0]
                cos_B11D, sin_B11D = self._rope(x_B1D, pos_B[:, None])
                rope_table = (cos_B11D.reshape(B, self.head_dim),
                              sin_B11D.reshape(B, self.head_dim))
                rows_B = torch.arange(B, dtype=torch.int32, device=x_B1D.device)
            return self._decode_fused(x_B1D, rope_table, rows_B, col_1, keys, k_cache,
                                      v_cache)
        rope = self._rope(x_B1D, pos_B[:, None])
        split, fuse = self._split_down(x_B1D), self.fuses_gate_up(x_B1D.device)
        split_out = self._split_out(x_B1D)
        for i in range(len(self.w_qkv)):
            q_B1HD, k_B1KD, v_B1KD = self._qkv(i, x_B1D, rope)
            k_cache[i].index_copy_(1, col_1, k_B1KD)
            v_cache[i].index_copy_(1, col_1, v_B1KD)
            o_BE = keys.attend(q_B1HD[:, 0], k_cache[i], v_cache[i], self.scale)
            x_B1D = self._finish_layer(i, x_B1D, o_BE[:, None], split, fuse, split_out)
        return self._logits(x_B1D[:, 0])

    def _decode_fused(self, x_B1D: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                      rope_row_B: torch.Tensor, col_1: torch.Tensor, keys: DecodeKeys,
                      k_cache: list[torch.Tensor], v_cache: list[torch.Tensor]
                      ) -> torch.Tensor:
        """`decode` with each layer's rotation, cache writes and attention in one kernel
        (`decode_attention.decode_attention_rope`; `FUSE_ROPE`); ``rope``: ``[R, Dh]`` tables
        read at row ``rope_row_B[b]``."""
        B = x_B1D.shape[0]
        layers = self.layer_plan(x_B1D.device)
        if layers is not None:
            h_BD = _run_triton_layers(self, layers, x_B1D[:, 0], rope, rope_row_B, col_1, keys,
                                      k_cache, v_cache)
            return F.linear(h_BD, self.head, self.head_bias)
        cos_RD, sin_signed_RD = rope
        split, fuse = self._split_down(x_B1D), self.fuses_gate_up(x_B1D.device)
        split_out = self._split_out(x_B1D)
        for i in range(len(self.w_qkv)):
            h_B1D = self._norm(x_B1D, self.ln1[i]).to(self.dtype)
            qkv_BX = F.linear(h_B1D[:, 0], self.w_qkv[i], self.b_qkv[i])
            o_BHD = decode_attention.decode_attention_rope(
                qkv_BX, cos_RD, sin_signed_RD, k_cache[i], v_cache[i], col_1, keys.start_B,
                keys.used_B, self.n_heads, self.scale, keys.src_B, keys.prompt_cols,
                rope_row_B)
            x_B1D = self._finish_layer(i, x_B1D, o_BHD.reshape(B, 1, -1), split, fuse,
                                       split_out)
        return self._logits(x_B1D[:, 0])


FUSE_ROPE = True
"""With the ``triton`` decode attention (and no q/k norm), rotate, write the cache and attend
in one kernel per layer (`decode_attention.decode_attention_rope`) instead of three more
launches per layer (measured on one H100: 104M 322k → 353k tokens/s, 0.5B 129k → 136k,
compiled). Checked against the eager path in Triton's interpreter
(tests/test_sampling_backends.py) and under bf16 on CUDA (tests/test_gpu.py). False: separate
kernels."""

ROPE_TABLE = True
"""With the fused decode kernel (`FUSE_ROPE`), each bucket computes the rotation of every
position its cache holds once (`HFStaticWeights.rope_table`), and each layer's kernel reads a
row's rotation at its position, instead of every decode step computing the rotations of its
rows: 8 small kernels a position in the compiled 104M step (a batched float32 product, the
cosines and sines, the signed copy), ~13 µs of a ~500 µs position on one H100. The values
are the same function of the position. False: computed every step."""

SPLIT_K_DOWN = 4
"""In the compiled decode step (``compile_sampler``; CUDA, bf16/fp16), the down projection as
this many float32 partial products over slices of its input (`split_k_linear`), summed into
the residual stream: at 256 rows cuBLAS runs the single product on too few blocks
(``benchmarks/gemm_layouts.py``). Measured on one H100, batch 256 × 128 (docs/performance.md):
compiled, 104M 406.5k → 426.7k tokens/s and 0.5B 152.8k → 159.7k; uncompiled, where the sum
over the slices is a kernel of its own, it lost 1–2%, so it applies only while
``torch.compile`` traces the step. The step's own layers only: the Triton layers
(`TRITON_LAYERS`) take `triton_layers.SPLIT_DOWN`. 0: one product."""

SPLIT_K_OUT = 4
"""As `SPLIT_K_DOWN`, for the attention's output projection (its bias, if any, added in
float32): cuBLAS runs the single product at 256 rows as 84 tiles of 40 × 64 on the H100's 132
SMs. A small gain, near the noise: in the compiled 104M sampler on H100s, batch 256 × 128,
four slices gave 461.6k tokens/s on average against 458.2k for one product (six and seven
runs over three calls, each call's mean in favour of the split by 0.5–1.3%), the 0.5B 161.9k
against 160.9k; 2 slices lost and 3 were neutral (docs/performance.md). The step's own
layers only (the Triton layers take `triton_layers.SPLIT_OUT`). 0: one product."""


TRITON_LAYERS = True
"""With the fused decode kernel (`FUSE_ROPE`), run each decode layer as Triton kernels only,
launched with programmatic dependent launch on Hopper (`triton_layers`): the products through
TMA descriptors, the norms with the residual adds and split-K sums, no cuBLAS. Applies where
`triton_layers.plan` does (CUDA with compute capability 9.0 or later, a half sampling dtype
over a float32 residual stream). Measured on H100s, batch 256 × 128, compiled
(docs/performance.md): 104M 460–467k → 504.2k tokens/s (``benchmarks/sampler_ab.py``) and
509.8k (``benchmarks/hf_engine.py``); 0.5B 162.8k → 172.0k; without PDL the same kernels
lose (450k). False: the step's own layers (cuBLAS products, compiled norms)."""

def _run_triton_layers(*args: Any) -> torch.Tensor:
    """`triton_layers.run` left out of ``torch.compile``'s trace
    (`triton_layers.uncompiled_run`: a graph break): its kernels are launched as they are,
    with PDL, inside the captured graph."""
    return triton_layers.uncompiled_run()(*args)


def _project(x_NI: torch.Tensor, w_OI: torch.Tensor, b_O: torch.Tensor | None,
             split: int) -> torch.Tensor:
    """``F.linear(x, w, b)``, or with ``split`` > 1 `split_k_linear` over that many slices
    (float32, the bias added in float32)."""
    if split <= 1:
        return F.linear(x_NI, w_OI, b_O)
    out = split_k_linear(x_NI, w_OI, split)
    return out if b_O is None else out + b_O


def split_k_linear(x_NI: torch.Tensor, w_OI: torch.Tensor, split: int) -> torch.Tensor:
    """``F.linear(x, w)`` in float32 as ``split`` partial products over equal slices of the
    input dimension (one strided batched matmul, no copies) summed over the slices: more
    blocks for cuBLAS at few rows, and no rounding of the product to the input dtype."""
    *lead, n_in = x_NI.shape
    x_MSk = x_NI.reshape(-1, split, n_in // split)
    w_OSk = w_OI.view(w_OI.shape[0], split, n_in // split)
    parts_SMO = torch.bmm(x_MSk.transpose(0, 1), w_OSk.permute(1, 2, 0),
                          out_dtype=torch.float32)
    return parts_SMO.sum(0).view(*lead, w_OI.shape[0])


FUSED_GATE_UP = True
"""Decode steps on CUDA in a half dtype run the MLP block's gate/up product and its SiLU
product as one Triton kernel (`gate_up.gate_up_silu`) instead of a cuBLAS product and an
elementwise kernel: one kernel and one gap fewer a layer. Measured on one H100, 104M at
batch 256 × 128 (docs/performance.md): compiled 457.2k → 461.2k tokens/s, graphed without
compiling 310.2k → 340.7k. The prefill keeps cuBLAS (many rows). The step's own layers only
(the Triton layers, `TRITON_LAYERS`, have their own gate/up kernel). False: the two steps."""

FUSED_DRAW = True
"""Draw over a large vocabulary at a plain temperature with `fused_draw` (two Triton passes)
where it `applies`; False: always `rlscope.sampling.draw.draw`."""

GRAPH_PREFILL = True
"""Where the decode step is graphed, the prefill (with token 0's draw) is too, one graph per
bucket and group count (`_Bucket.run_prefill`). False: eager, as before."""

COMPILE_PREFILL = True
"""With ``compile_sampler``, the graphed prefill is compiled too (`_Bucket.prefill_fn`):
eager, its elementwise steps over ``[G, P, ...]`` float32 tensors (the rotation, the norms,
the residual adds) run as ~25 kernels a layer. False: the graphed prefill stays eager."""

SHARE_PROMPT_KEYS = True
"""With the ``triton`` decode attention, the rows of a group read their shared prompt's keys
from the group's first row (`DecodeKeys.src_B`), so the group's rows, whose programs run
side by side, find them in L2: after 64-token prompts, half of the keys an average position
of a 128-token completion reads are its prompt's, read once per group instead of once per
row. False: every row reads its own copy (the same values)."""

DECODE_KERNEL = "auto"
"""The decode attention of bf16/fp16 sampling on CUDA: ``auto`` (the Triton kernel where
Triton is installed, else torch's flash kernel), ``triton``, ``flash`` or ``mask`` (the
additive-mask SDPA of every other case). `decode_attention_kind` applies it."""


def decode_attention_kind(device: torch.device, dtype: torch.dtype, head_dim: int) -> str:
    """How the decode step attends (`DecodeKeys`): ``triton`` (`decode_attention`: one
    kernel over each row's written keys), ``flash`` (torch's flash kernel with per-row key
    lengths, ``aten._flash_attention_forward`` with ``seqused_k``) or ``mask`` (SDPA under an
    additive key mask: CPU, float32, or where neither kernel applies). `DECODE_KERNEL` picks."""
    if DECODE_KERNEL == "mask" or device.type != "cuda" \
            or dtype not in (torch.float16, torch.bfloat16):
        return "mask"
    if DECODE_KERNEL in ("auto", "triton") and decode_attention.available(head_dim):
        return "triton"
    if DECODE_KERNEL in ("auto", "flash") and head_dim % 8 == 0 and head_dim <= 256:
        op = getattr(torch.ops.aten, "_flash_attention_forward", None)
        if op is not None and "seqused_k" in str(op.default._schema):
            return "flash"
    return "mask"


def flash_varlen(q_NKD: torch.Tensor, k_MKD: torch.Tensor, v_MKD: torch.Tensor,
                 cu_q: torch.Tensor, cu_k: torch.Tensor, max_q: int, max_k: int, scale: float,
                 used_B: torch.Tensor) -> torch.Tensor:
    """Non-causal attention of query rows ``q_NKD[cu_q[b]:cu_q[b+1]]`` over the keys
    ``k_MKD[cu_k[b]:cu_k[b] + used_B[b]]`` of each sequence ``b`` (int32 offsets), on torch's
    flash kernel (CUDA, fp16/bf16)."""
    out: torch.Tensor = torch.ops.aten._flash_attention_forward(
        q_NKD, k_MKD, v_MKD, cu_q, cu_k, max_q, max_k, 0.0, False, False, scale=scale,
        seqused_k=used_B)[0]
    return out


class DecodeKeys:
    """Which cache columns each decode query attends to, and the attention over them.

    The caches are ``[B, L, K, Dh]``; a row's real prompt keys sit in columns
    ``[P - len_b, P)`` (left padding) and its generated keys from column ``P`` on, one column
    per position for every row. ``kind`` (`decode_attention_kind`):

    - ``mask`` (any device and dtype): an additive key mask ``bias_BKL`` (0 where attended,
      -inf elsewhere) over the whole cache, the ``group`` query heads of each kv head as
      ``group`` query rows of one fused attention call (no repeated keys);
    - ``triton``: `decode_attention.decode_attention` over columns ``start_B .. start_B +
      used_B`` of each row;
    - ``flash``: torch's flash kernel in its variable-length form, each row's first attended
      column as its key offset (``cu_seq_k``) and the count of attended columns as
      ``seqused_k``; the query heads of a kv head are again its ``group`` query rows.

    ``triton`` and ``flash`` read only written keys and need left-padded prompts
    (`left_padded`).
    """

    def __init__(self, rows: int, n_kv: int, n_heads: int, length: int, dtype: torch.dtype,
                 device: torch.device, kind: str) -> None:
        self.rows, self.n_kv, self.group, self.length = rows, n_kv, n_heads // n_kv, length
        self.kind = kind
        self.bias_BKL = torch.full((rows, n_kv, length), float("-inf"), dtype=dtype,
                                   device=device)
        steps = torch.arange(rows + 1, dtype=torch.int32, device=device)
        self.cu_q = steps * self.group
        self.cu_k = steps * length
        self.start_B = torch.zeros(rows, dtype=torch.int32, device=device)
        self.used_B = torch.zeros(rows, dtype=torch.int32, device=device)
        self.src_B = torch.arange(rows, dtype=torch.int32, device=device)
        """``triton``: the cache row each row reads its prompt's keys from (`SHARE_PROMPT_KEYS`)."""
        self.prompt_cols = 0
        """Columns ``[0, prompt_cols)`` hold prompts (the bucket's prompt length)."""

    def reset(self, mask_BP: torch.Tensor, src_B: torch.Tensor | None = None) -> None:
        """A new prefill of ``[B, P]`` left-padded prompts (``mask_BP`` bool): attend to the
        real prompt columns only; ``src_B`` (``[B]``, ``triton`` only): the row of the same
        prompt whose cache holds its keys (default: the row itself)."""
        B, P = mask_BP.shape
        self.prompt_cols = P
        if src_B is None:
            self.src_B.copy_(torch.arange(B, dtype=torch.int32, device=mask_BP.device))
        else:
            self.src_B.copy_(src_B)
        self.bias_BKL.fill_(float("-inf"))
        self.bias_BKL[:, :, :P].masked_fill_(mask_BP[:, None, :], 0.0)
        len_B = mask_BP.sum(-1).to(torch.int32)
        self.start_B.copy_(P - len_B)
        self.cu_k[:B].copy_(torch.arange(B, device=mask_BP.device, dtype=torch.int32)
                            * self.length + self.start_B)
        self.used_B.copy_(len_B)

    def advance(self, col_1: torch.Tensor) -> None:
        """Attend to cache column ``col_1`` from now on (graph-safe)."""
        if self.kind == "mask":
            self.bias_BKL.index_fill_(2, col_1, 0.0)
        else:
            self.used_B += 1

    def attend(self, q_BHD: torch.Tensor, k_BLKD: torch.Tensor, v_BLKD: torch.Tensor,
               scale: float) -> torch.Tensor:
        """``[B, H·Dh]`` attention outputs of the queries ``q_BHD`` (head ``h = k·group + g``)."""
        B, H, Dh = q_BHD.shape
        K, G, L = self.n_kv, self.group, self.length
        if self.kind == "triton":
            return decode_attention.decode_attention(
                q_BHD, k_BLKD, v_BLKD, self.start_B, self.used_B, scale, self.src_B,
                self.prompt_cols).reshape(B, H * Dh)
        if self.kind == "flash":
            q_NKD = q_BHD.view(B, K, G, Dh).transpose(1, 2).reshape(B * G, K, Dh)
            o_NKD = flash_varlen(q_NKD, k_BLKD.view(B * L, K, Dh), v_BLKD.view(B * L, K, Dh),
                                 self.cu_q, self.cu_k, G, L, scale, self.used_B)
            return o_NKD.view(B, G, K, Dh).transpose(1, 2).reshape(B, H * Dh)
        o_BKGD = F.scaled_dot_product_attention(
            q_BHD.view(B, K, G, Dh), k_BLKD.transpose(1, 2), v_BLKD.transpose(1, 2),
            attn_mask=self.bias_BKL.view(B, K, 1, L), scale=scale)
        return o_BKGD.reshape(B, H * Dh)


def left_padded(mask_BP: torch.Tensor) -> bool:
    """Whether every row's real tokens are contiguous and end at the last column."""
    if not mask_BP.numel():
        return True
    return bool((mask_BP.long().diff(dim=-1) >= 0).all() & mask_BP[:, -1].all())  # one read


@dataclass
class _Bucket:
    """Static buffers (and on CUDA the decode-step graph) for one shape of batch."""

    weights: HFStaticWeights
    rows: int
    prompt_len: int
    new_tokens: int
    cfg: SamplingConfig
    pad_token_id: int
    with_entropy: bool
    with_sum_p2: bool
    attention: str = "mask"
    """The decode attention's kind (`DecodeKeys`, `decode_attention_kind`)."""
    k_cache: list[torch.Tensor] = field(default_factory=list)
    v_cache: list[torch.Tensor] = field(default_factory=list)
    out: dict[str, torch.Tensor] = field(default_factory=dict)
    graph: Any = None
    prefills: dict[int, tuple[Any, dict[str, torch.Tensor]]] = field(default_factory=dict)
    """Graphed prefills by group bucket: ``(graph, its static inputs)`` (`run_prefill`)."""

    def __post_init__(self) -> None:
        w, B, device = self.weights, self.rows, self.weights.device
        # a multiple of 16 keys: fused attention kernels want an aligned mask row
        L = self.prompt_len + bucket_prompt_len(self.new_tokens)
        for _ in range(len(w.w_qkv)):
            self.k_cache.append(torch.zeros(B, L, w.n_kv, w.head_dim, dtype=w.dtype,
                                            device=device))
            self.v_cache.append(torch.zeros_like(self.k_cache[-1]))
        self.keys = DecodeKeys(B, w.n_kv, w.n_heads, L, w.dtype, device, self.attention)
        """The keys each query attends to: real prompt tokens and written positions."""
        self.pos_B = torch.zeros(B, dtype=torch.long, device=device)
        self.col_1 = torch.zeros(1, dtype=torch.long, device=device)
        self.step = torch.zeros((), dtype=torch.long, device=device)
        self.token_B = torch.zeros(B, dtype=torch.long, device=device)
        self.alive_B = torch.ones(B, dtype=torch.bool, device=device)
        self.seeds_B = torch.zeros(B, dtype=torch.long, device=device)
        self.stops = torch.tensor(self.cfg.stop_token_ids, dtype=torch.long, device=device)
        self.column_keys_V = column_keys(w.vocab_size, device)
        self.noise: Callable[..., torch.Tensor] = _compiled_noise() \
            if device.type == "cuda" and COMPILE_NOISE else gumbel_offsets_at
        self.rope_table = w.rope_table(L) if ROPE_TABLE and w.fuses_rope(self.attention) \
            else None
        """Every cache position's rotation (`ROPE_TABLE`), read by the fused decode kernel."""
        self.fused_draw = FUSED_DRAW and fused_draw.applies(self.cfg, w.vocab_size, device)
        """Whether `draw_step` draws with `fused_draw.fused_draw` (`FUSED_DRAW`)."""
        # the kernels this bucket runs, imported before any compile traces them
        # (`decode_attention.load`)
        if self.attention == "triton":
            decode_attention.load()
        if self.fused_draw:
            fused_draw.load()
        if w.fuses_gate_up(device):
            gate_up.load()
        if self.attention == "triton" and w.fuses_rope(self.attention) \
                and w.layer_plan(device) is not None:
            triton_layers.load()
        self.step_fn: Callable[[], None] = compile_step(self.decode_step) \
            if self.cfg.compile_sampler and compiles(device) else self.decode_step
        """`decode_step`, compiled with ``compile_sampler`` (what is captured and run)."""
        self.prefill_fn: Callable[..., None] = _compile(self.prefill_step) \
            if self.cfg.compile_sampler and COMPILE_PREFILL and compiles(device) \
            else self.prefill_step
        """`prefill_step`, compiled with ``compile_sampler`` where the prefill is graphed
        (`COMPILE_PREFILL`; one compile per group bucket)."""

    def prefill_step(self, tokens_GP: torch.Tensor, mask_GP: torch.Tensor,
                     rows_N: torch.Tensor, groups_N: torch.Tensor,
                     row_group_B: torch.Tensor) -> None:
        """Prefill the prompts (`HFStaticWeights.prefill`) and draw every row's token 0 from
        its group's logits (graph-safe)."""
        logits_GV = self.weights.prefill(tokens_GP, mask_GP, rows_N, groups_N, self.k_cache,
                                         self.v_cache)
        self.draw_step(logits_GV.index_select(0, row_group_B))

    def run_prefill(self, tokens_GP: torch.Tensor, mask_GP: torch.Tensor, first_G: torch.Tensor,
                    row_group_B: torch.Tensor, shared: bool, graphed: bool,
                    reset: Callable[[], None]) -> None:
        """`prefill_step` after ``reset()`` (which sets the decode state). The keys of prompt
        ``g`` go to cache row ``first_G[g]`` only (``shared``: every row of the group reads
        them there) or to every row ``b`` of group ``row_group_B[b]``. ``graphed``: replay a
        CUDA graph of it, captured on first use for this many groups rounded up to a power of
        two (extra groups repeat group 0, so they rewrite its keys with the same values): the
        eager prefill is bound by launching ~25 kernels a layer from the host (17–19 ms per
        call on an H100 at both of issue 17's shapes)."""
        G, device = tokens_GP.shape[0], tokens_GP.device
        fill_G = F.pad(torch.arange(G, device=device), (0, bucket_rows(G) - G)) if graphed \
            else torch.arange(G, device=device)
        if shared:
            rows_N, groups_N = first_G[fill_G], fill_G
        else:
            rows_N, groups_N = torch.arange(self.rows, device=device), row_group_B
        inputs = {"tokens": tokens_GP[fill_G], "mask": mask_GP[fill_G], "rows": rows_N,
                  "groups": groups_N, "row_group": row_group_B}
        if not graphed:
            reset()
            self.prefill_step(*inputs.values())
            return
        entry = self.prefills.get(len(fill_G))
        if entry is None or any(entry[1][k].shape != v.shape for k, v in inputs.items()):
            static = {k: v.clone() for k, v in inputs.items()}
            reset()
            with torch.autocast(self.weights.device.type, enabled=False):
                if self.prefill_fn is not self.prefill_step:
                    # compiled: the first call allocates the draw's buffers (`record_draw`),
                    # which changes the step's guards; recompiling must not happen inside
                    # the capture, so a second call settles the guards first
                    self.prefill_fn(*static.values())
                graph = capture(lambda: self.prefill_fn(*static.values()))
            entry = self.prefills[len(fill_G)] = (graph, static)
        for name, value in inputs.items():
            entry[1][name].copy_(value)
        reset()
        entry[0].replay()

    def gumbel(self, V: int) -> torch.Tensor:
        """This step's `gumbel_offsets` ``[B, V]``, on CUDA from one compiled kernel (the
        same integer hash; a GPU test checks the bits equal the eager function's, which makes
        ~20 passes over a ``[B, V]`` int64 tensor, milliseconds per position at a 152k
        vocabulary). Falls back to the eager
        function for good if compiling fails (this first happens at the prefill's draw,
        outside any capture)."""
        keys_V = self.column_keys_V[:V]
        if self.noise is not gumbel_offsets_at:
            try:
                return self.noise(self.seeds_B, self.step, keys_V)
            except Exception:  # no Triton / compiler: any failure means "run it eagerly"
                if torch.cuda.is_current_stream_capturing():
                    raise
                self.noise = gumbel_offsets_at
        return gumbel_offsets_at(self.seeds_B, self.step, keys_V)

    def draw_step(self, logits_BV: torch.Tensor) -> None:
        """Draw this step's token from ``logits_BV`` and record it (graph-safe)."""
        stops = bool(self.stops.numel())
        alive_B = self.alive_B if stops else None
        if self.fused_draw:
            d = fused_draw.fused_draw(logits_BV, alive_B, self.seeds_B, self.step, self.cfg,
                                      self.pad_token_id, self.with_entropy, self.with_sum_p2)
        else:
            gumbel_BV = None if self.cfg.temperature == 0 else self.gumbel(logits_BV.shape[-1])
            d = draw(logits_BV, alive_B, gumbel_BV, self.cfg, self.pad_token_id,
                     self.with_entropy, self.with_sum_p2)
        record_draw(self.out, self.new_tokens, self.step.view(1), d, alive_B)
        if stops:
            # = torch.isin, whose sorting path (long stop lists) cannot be captured
            self.alive_B &= ~(d.token_B[:, None] == self.stops).any(-1)
        self.token_B.copy_(d.token_B)

    def decode_step(self) -> None:
        """Feed the last token, advance the counters, draw the next token (graph-safe)."""
        logits_BV = self.weights.decode(self.token_B, self.pos_B, self.col_1, self.keys,
                                        self.k_cache, self.v_cache, self.rope_table)
        self.col_1 += 1
        self.pos_B += 1
        self.step += 1
        self.draw_step(logits_BV)

    def capture(self) -> None:
        """Record `decode_step` as a CUDA graph (the warm-up's effects are reset by the next
        prefill)."""
        with torch.autocast(self.weights.device.type, enabled=False):
            self.graph = capture(self.step_fn)


COMPILE_NOISE = True
"""Compile `gumbel_offsets` into one kernel on CUDA (`_Bucket.gumbel`)."""
_NOISE: list[Callable[..., torch.Tensor]] = []


def _compiled_noise() -> Callable[..., torch.Tensor]:
    """`gumbel_offsets_at` through ``torch.compile`` (built once per process)."""
    if not _NOISE:
        _NOISE.append(torch.compile(gumbel_offsets_at, dynamic=False))
    return _NOISE[0]


# policy -> (sampling dtype, weights, {bucket key: bucket})
_DECODERS: weakref.WeakKeyDictionary[Any, tuple[torch.dtype, HFStaticWeights, dict]] = \
    weakref.WeakKeyDictionary()


def compiles(device: torch.device) -> bool:
    """Whether ``compile_sampler`` compiles on ``device`` (CUDA only)."""
    return device.type == "cuda"


COMPILE_MODE: str | None = None
"""``torch.compile`` mode of ``compile_sampler`` (None: the default mode)."""

COMPILE_OPTIONS: dict[str, Any] = {}
"""Inductor options of ``compile_sampler``'s compiles (``torch.compile(..., options=...)``,
e.g. ``{"coordinate_descent_tuning": True}``); used only while `COMPILE_MODE` is None
(``torch.compile`` takes a mode or options, not both)."""


def _compile(fn: Callable[..., None]) -> Callable[..., None]:
    """``fn`` through ``torch.compile`` with static shapes and `COMPILE_MODE` or
    `COMPILE_OPTIONS`."""
    if COMPILE_MODE is None and COMPILE_OPTIONS:
        return torch.compile(fn, dynamic=False, options=dict(COMPILE_OPTIONS))
    return torch.compile(fn, dynamic=False, mode=COMPILE_MODE)


def compile_step(step: Callable[[], None]) -> Callable[[], None]:
    """``step`` through ``torch.compile`` (static shapes: one compile per bucket)."""
    return _compile(step)


def can_capture(device: torch.device) -> bool:
    """Whether the decode step is recorded as a CUDA graph on ``device`` (CUDA, not already
    inside a capture)."""
    return device.type == "cuda" and not torch.cuda.is_current_stream_capturing()


def sampling_dtype(policy: Policy, device: torch.device) -> torch.dtype:
    """bf16/fp16 when the policy autocasts on CUDA, else the parameters' dtype."""
    autocast = getattr(policy, "autocast_dtype", None)
    if autocast is not None and device.type == "cuda":
        return autocast
    return next(iter(policy.parameters())).dtype


def bucket_rows(rows: int) -> int:
    """Rows rounded up to a power of two, at least `MIN_ROWS`."""
    return max(MIN_ROWS, 1 << (rows - 1).bit_length())


def bucket_prompt_len(prompt_len: int) -> int:
    """Prompt length rounded up to a multiple of `PROMPT_MULTIPLE`."""
    return -(-prompt_len // PROMPT_MULTIPLE) * PROMPT_MULTIPLE


def _prefill_groups(tokens_BP: torch.Tensor, mask_BP: torch.Tensor,
                    group_id_B: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(first_G, row_group_B)``: one representative row per group and each row's group.
    Rows of a group must share the prompt; when they do not, every row is its own group."""
    B = tokens_BP.shape[0]
    rows_B = torch.arange(B, device=tokens_BP.device)
    if group_id_B is None:
        return rows_B, rows_B
    _, row_group_B = torch.unique(group_id_B, return_inverse=True)
    G = int(row_group_B.max()) + 1
    first_G = torch.full((G,), B, dtype=torch.long, device=tokens_BP.device) \
        .scatter_reduce(0, row_group_B, rows_B, "amin")
    rep_B = first_G[row_group_B]
    if G == B or not bool(((tokens_BP[rep_B] == tokens_BP) & (mask_BP[rep_B] == mask_BP)).all()):
        return rows_B, rows_B
    return first_G, row_group_B


class HFStaticBackend:
    """`GenerationBackend` of the static decoder (see the module docstring)."""

    name = "static"

    def supports(self, policy: Policy, device: torch.device) -> bool:
        """Whether the static decoder implements ``policy``'s model."""
        return unsupported_reason(policy) is None

    def unsupported_reason(self, policy: Policy, device: torch.device) -> str | None:
        """Why it does not (None when it does)."""
        return unsupported_reason(policy)

    def decoder(self, policy: Policy, device: torch.device) -> HFStaticWeights:
        """The policy's cached sampler weights, refreshed from its parameters if they moved."""
        dtype = sampling_dtype(policy, device)
        cached = _DECODERS.get(policy)
        if cached is None or cached[0] != dtype or cached[1].device != device:
            cached = _DECODERS[policy] = (
                dtype, HFStaticWeights(policy.unwrap(), dtype), {})  # type: ignore[attr-defined]
        cached[1].refresh()
        return cached[1]

    @torch.no_grad()
    def generate(self, policy: Policy, prompts: PromptBatch, cfg: SamplingConfig,
                 row_seeds_B: torch.Tensor, max_new_tokens: int, pad_token_id: int = 0,
                 group_id_B: torch.Tensor | None = None, with_entropy: bool = False,
                 with_sum_p2: bool = False) -> RolloutBatch:
        """`rlscope.sampling.sampler.generate` through the static decoder (check `supports`)."""
        reason = unsupported_reason(policy)
        if reason is not None:
            raise ValueError(f"the static sampler cannot run this policy: {reason}")
        B, P = prompts.tokens_BP.shape
        window = sliding_window(policy)
        if window is not None and P + max_new_tokens > window:
            if cfg.backend == "auto":  # the eager path has the model's own sliding window
                return generate_eager(policy, prompts, cfg, row_seeds_B, max_new_tokens,
                                      pad_token_id, group_id_B, with_entropy, with_sum_p2)
            raise ValueError(f"the static sampler has no sliding-window attention: prompt + "
                             f"completion ({P + max_new_tokens}) exceeds the model's "
                             f"sliding_window={window}; use --backend eager")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1")
        max_len = getattr(policy, "max_len", None)
        if max_len is not None and P + max_new_tokens > max_len:  # as HFPolicy.init_cache
            raise ValueError(f"cache of {P + max_new_tokens} positions exceeds "
                             f"max_position_embeddings={max_len}")
        device = prompts.tokens_BP.device
        weights = self.decoder(policy, device)
        Bb, Pb = bucket_rows(B), bucket_prompt_len(P)
        # what the captured step depends on (not the backend's name or the stop-check period)
        step_cfg = dataclasses.replace(cfg, backend="static", stop_check_every=1,
                                       max_new_tokens=0)
        # the kernels read each row's keys from one offset on: left padding only
        attention = decode_attention_kind(device, weights.dtype, weights.head_dim)
        if attention != "mask" and prompts.attention_mask_BP is not None \
                and not left_padded(prompts.attention_mask_BP.bool()):
            attention = "mask"
        key = (Bb, Pb, max_new_tokens, step_cfg, pad_token_id, with_entropy, with_sum_p2,
               attention)
        buckets = _DECODERS[policy][2]
        bucket = buckets.get(key)
        if bucket is None:
            while len(buckets) >= MAX_BUCKETS:
                del buckets[next(iter(buckets))]
            bucket = buckets[key] = _Bucket(weights, Bb, Pb, max_new_tokens, step_cfg,
                                            pad_token_id, with_entropy, with_sum_p2,
                                            attention)
        graphed = cfg.decode_graphs and max_new_tokens > 1 and can_capture(device)
        with torch.autocast(device.type, enabled=False):
            self._prefill(bucket, prompts, row_seeds_B, group_id_B, graphed and GRAPH_PREFILL)
        if bucket.graph is None and graphed:
            bucket.capture()
            with torch.autocast(device.type, enabled=False):  # the warm-up moved the state
                self._prefill(bucket, prompts, row_seeds_B, group_id_B,
                              GRAPH_PREFILL)
        stops = bool(bucket.stops.numel())
        n = 1
        with torch.autocast(device.type, enabled=False):
            while n < max_new_tokens:
                if stops and n % cfg.stop_check_every == 0 and not bool(bucket.alive_B.any()):
                    break
                if bucket.graph is not None:
                    bucket.graph.replay()
                else:
                    bucket.step_fn()
                n += 1
        out = {name: buf[:B] for name, buf in bucket.out.items()}
        if stops:
            n = int(out["alive"][:, :n].any(0).sum())  # the last position any row was alive
        out = {name: buf[:, :n] for name, buf in out.items()}
        keep = out.get("keep")
        return assemble(prompts,
                        tokens_BT=out["token"].clone(),
                        alive_BT=out["alive"] if stops else
                        torch.ones(B, n, dtype=torch.bool, device=device),
                        logp_sampler_BT=out["logp_sampler"],
                        logp_raw_BT=out.get("logp_raw", out["logp_sampler"]),
                        keep_BTV=keep.clone() if keep is not None else None,
                        entropy_BT=out.get("entropy"),
                        finished_by_stop_B=~bucket.alive_B[:B] if stops else
                        torch.zeros(B, dtype=torch.bool, device=device),
                        group_id_B=group_id_B, sum_p2_BT=out.get("sum_p2"))

    @staticmethod
    def _prefill(bucket: _Bucket, prompts: PromptBatch, row_seeds_B: torch.Tensor,
                 group_id_B: torch.Tensor | None, graphed: bool = False) -> None:
        """Reset the bucket's state, prefill the prompts (once per group) and draw token 0
        (``graphed``: from a CUDA graph, `_Bucket.run_prefill`)."""
        tokens_BP = prompts.tokens_BP
        B, P = tokens_BP.shape
        Bb, Pb = bucket.rows, bucket.prompt_len
        device = tokens_BP.device
        mask_BP = prompts.attention_mask_BP.bool() if prompts.attention_mask_BP is not None \
            else torch.ones(B, P, dtype=torch.bool, device=device)
        first_G, row_group_B = _prefill_groups(tokens_BP, mask_BP, group_id_B)
        # bucket padding: extra left columns (masked) and extra rows (copies of row 0)
        tokens_GP = F.pad(tokens_BP[first_G], (Pb - P, 0))
        mask_GP = F.pad(mask_BP[first_G], (Pb - P, 0))
        row_group_Bb = torch.cat([row_group_B, row_group_B[:1].expand(Bb - B)])
        mask_BbPb = mask_GP[row_group_Bb]
        # the prompt's keys in the group's first row only, where every row reads them
        share = bucket.attention == "triton" and SHARE_PROMPT_KEYS
        src_Bb = first_G[row_group_Bb] if share else None
        pos_Bb = mask_BbPb.sum(-1)

        def reset() -> None:
            bucket.keys.reset(mask_BbPb, src_Bb)
            bucket.pos_B.copy_(pos_Bb)
            bucket.col_1.fill_(Pb)
            bucket.step.zero_()
            bucket.alive_B.zero_()
            bucket.alive_B[:B] = True
            bucket.seeds_B.zero_()
            bucket.seeds_B[:B].copy_(row_seeds_B)

        bucket.run_prefill(tokens_GP, mask_GP, first_G, row_group_Bb, share, graphed, reset)
