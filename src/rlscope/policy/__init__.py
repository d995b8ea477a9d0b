"""Policies: the `Policy` protocol, the built-in tiny transformer, the Hugging Face adapter,
and the value head. `build_policy` turns a `ModelConfig` into a policy."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn

from rlscope.policy.base import Policy, position_ids_from_mask
from rlscope.policy.tiny import TinyConfig, TinyTransformer
from rlscope.policy.value_head import ValueHead

if TYPE_CHECKING:
    from rlscope.policy.hf import HFPolicy

MODEL_ARCHS = ("tiny", "llama", "qwen2", "hf")
AUTOCAST_DTYPES = {"none": None, "bf16": torch.bfloat16}
"""--autocast choices and the dtype each runs the forward passes in."""


@dataclass(frozen=True)
class ModelConfig:
    """Which policy to train."""

    arch: str = "tiny"
    """tiny (built-in transformer), llama / qwen2 (a Hugging Face architecture built from a
    config with the sizes below, random init, no download), or hf (pretrained from `path`)."""
    path: str = ""
    """Local directory of a pretrained Hugging Face causal LM (arch=hf)."""
    d_model: int = 64
    """Residual width."""
    n_heads: int = 2
    """Attention heads."""
    n_layers: int = 2
    """Transformer blocks."""
    embed_init: Literal["reference", "balanced"] = "reference"
    """Initialisation of the tiny transformer (arch=tiny). reference: the reference sandbox's
    model, PyTorch's default init distributions throughout (token and position embeddings
    N(0, 1), the token vector then scaled by sqrt(d_model), so the token signal starts
    sqrt(d_model) times the position signal; attention and feed-forward as in
    nn.TransformerEncoderLayer; the draws come in another order, so not the reference's
    numbers for a seed); the sandbox's experiments are defined under it. balanced:
    token embeddings N(0, d_model^-1) so that, once scaled, they match the unit-std position
    embeddings; positional tasks such as reversal then learn far faster (supervised CE solves
    token_reversal in ~60 steps instead of >300), which changes the regime the methods are
    compared in (docs/architecture.md)."""
    dtype: str = "float32"
    """Parameter dtype: float32 or float64 (tests use float64 for exact identities)."""
    lora_rank: int = 0
    """LoRA rank r for Hugging Face policies (llama, qwen2, hf), via PEFT: the base weights
    are frozen and only the adapters train; the run saves them to ``<run_dir>/adapter``
    (PEFT format). 0 = off (full fine-tuning). Hu et al. arXiv:2106.09685."""
    lora_alpha: int = 16
    """LoRA scaling α (the update is (α / r)·B·A)."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA branch's input while training."""
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    """Module names (suffixes) that get adapters; ``all-linear`` = every linear layer but the
    output head."""
    autocast: str = "none"
    """Mixed precision: bf16 runs the forward passes (sampler, learner, reference) under
    ``torch.autocast`` in bfloat16 while the weights, gradients and optimizer state stay
    float32 (the master copy) and logits come back as float32; none = full precision. Meant
    for CUDA (bf16 tensor cores); on CPU it works but is slower. Needs --dtype float32."""
    intermediate_size: int = 0
    """MLP width of the Hugging Face architectures (llama, qwen2); 0 = 2 × d_model."""
    n_kv_heads: int = 0
    """Key/value heads of the Hugging Face architectures (grouped-query attention); 0 = half
    of n_heads when it is even, else n_heads."""
    attn_implementation: str = "eager"
    """Attention kernel of the Hugging Face architectures built from a config: eager (no host
    sync while decoding padded rows) or sdpa (PyTorch's fused attention; faster learner on
    GPU)."""
    gradient_checkpointing: bool = False
    """Hugging Face policies: recompute each block's activations in the backward pass instead
    of storing them (less memory, about one more forward of compute; same update)."""

    def validate(self) -> list[str]:
        errors = []
        if self.arch not in MODEL_ARCHS:
            errors.append(f"model.arch={self.arch!r} is unknown; valid: {', '.join(MODEL_ARCHS)}")
        if self.arch == "hf" and not self.path:
            errors.append("model.arch='hf' needs model.path (a local model directory)")
        if self.d_model <= 0 or self.n_heads <= 0 or self.n_layers <= 0:
            errors.append("model.d_model, model.n_heads and model.n_layers must be > 0")
        elif self.d_model % self.n_heads:
            errors.append(f"model.d_model={self.d_model} must be divisible by "
                          f"model.n_heads={self.n_heads}")
        if self.embed_init not in ("reference", "balanced"):
            errors.append(f"model.embed_init={self.embed_init!r}: use reference or balanced")
        elif self.embed_init != ModelConfig.embed_init and self.arch != "tiny":
            errors.append(f"model.embed_init={self.embed_init} applies to --arch tiny only "
                          f"(got --arch {self.arch})")
        if self.dtype not in ("float32", "float64"):
            errors.append(f"model.dtype={self.dtype!r}: use float32 or float64")
        if self.autocast not in AUTOCAST_DTYPES:
            errors.append(f"model.autocast={self.autocast!r}: use "
                          f"{' or '.join(AUTOCAST_DTYPES)}")
        elif self.autocast != "none" and self.dtype != "float32":
            errors.append(f"model.autocast={self.autocast} keeps float32 master weights; set "
                          f"--dtype float32 (got {self.dtype})")
        if self.intermediate_size < 0 or self.n_kv_heads < 0:
            errors.append("model.intermediate_size and model.n_kv_heads must be >= 0 "
                          "(0 = default)")
        elif self.n_kv_heads and self.n_heads % self.n_kv_heads:
            errors.append(f"model.n_heads={self.n_heads} must be a multiple of "
                          f"model.n_kv_heads={self.n_kv_heads}")
        if self.attn_implementation not in ("eager", "sdpa"):
            errors.append(f"model.attn_implementation={self.attn_implementation!r}: use eager "
                          "or sdpa")
        hf_only = [name for name, default in (("intermediate_size", 0), ("n_kv_heads", 0),
                                              ("attn_implementation", "eager"))
                   if getattr(self, name) != default]
        if hf_only and self.arch != "llama" and self.arch != "qwen2":
            errors.append(f"model.{', model.'.join(hf_only)} apply to --arch llama or qwen2 "
                          f"only (got --arch {self.arch})")
        if self.lora_rank < 0:
            errors.append(f"model.lora_rank={self.lora_rank} must be >= 0 (0 = off)")
        if self.lora_rank > 0 and self.arch == "tiny":
            errors.append("model.lora_rank > 0 needs a Hugging Face policy (--arch llama, qwen2 "
                          "or hf): LoRA is applied through PEFT, which the built-in tiny "
                          "transformer does not support")
        if self.gradient_checkpointing and self.arch == "tiny":
            errors.append("model.gradient_checkpointing needs a Hugging Face policy (--arch "
                          "llama, qwen2 or hf)")
        if self.lora_rank > 0 and (self.lora_alpha <= 0 or not 0 <= self.lora_dropout < 1
                                   or not self.lora_targets):
            errors.append("model.lora_alpha must be > 0, model.lora_dropout in [0, 1) and "
                          "model.lora_targets non-empty")
        return errors


def build_policy(cfg: ModelConfig, vocab_size: int, max_len: int) -> Policy:
    """A freshly initialised policy (seed the global torch RNG first for reproducibility)."""
    dtype = getattr(torch, cfg.dtype)
    if cfg.arch == "tiny":
        tiny = TinyConfig(vocab_size=vocab_size, max_len=max_len, d_model=cfg.d_model,
                          n_heads=cfg.n_heads, n_layers=cfg.n_layers,
                          embed_init=cfg.embed_init)
        tiny_policy = TinyTransformer(tiny).to(dtype)
        tiny_policy.autocast_dtype = AUTOCAST_DTYPES[cfg.autocast]
        return tiny_policy
    from rlscope.policy.hf import HFPolicy, load_hf_model, tiny_hf_model

    if cfg.arch == "hf":
        model = load_hf_model(cfg.path)
    else:
        model = tiny_hf_model(cfg.arch, vocab_size, seed=None, hidden_size=cfg.d_model,
                              num_layers=cfg.n_layers, num_heads=cfg.n_heads, max_len=max_len,
                              intermediate_size=cfg.intermediate_size,
                              num_kv_heads=cfg.n_kv_heads,
                              attn_implementation=cfg.attn_implementation)
    if cfg.gradient_checkpointing:
        # Non-reentrant checkpointing also works when the inputs need no grad (a frozen base).
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x
            model.activation_checkpointing_enable(  # type: ignore[operator]
                activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(  # type: ignore[operator]
                gradient_checkpointing_kwargs={"use_reentrant": False})
    policy = HFPolicy(model).to(dtype)
    policy.autocast_dtype = AUTOCAST_DTYPES[cfg.autocast]
    return add_lora(policy, cfg) if cfg.lora_rank > 0 else policy


def add_lora(policy: HFPolicy, cfg: ModelConfig) -> HFPolicy:
    """``policy`` with LoRA adapters of ``cfg`` (rank, α, dropout, targets) through PEFT: the
    current weights become the frozen base and the adapters start as a no-op (B = 0), so the
    policy computes the same function until it trains (Hu et al. arXiv:2106.09685). Used by
    `build_policy`, and by `rlscope train --init` after loading full weights."""
    from peft import LoraConfig, get_peft_model

    from rlscope.policy.hf import HFPolicy

    targets = cfg.lora_targets
    lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules="all-linear" if targets == ("all-linear",)
                      else list(targets))
    first = next(policy.parameters())
    wrapped = HFPolicy(get_peft_model(policy.unwrap(), lora)).to(first.device, first.dtype)
    wrapped.autocast_dtype = policy.autocast_dtype
    return wrapped


class AdapterDisabled(nn.Module):
    """The KL reference of a LoRA policy: the same model with its adapters switched off (the
    frozen base), so the reference costs no second copy of the weights.

    The policy is held outside the module tree: this module has no parameters or state of its
    own, and ``eval()`` / ``requires_grad_`` / checkpoints leave the policy alone. Every
    `Policy` call runs the policy's own with the adapters disabled for its duration."""

    def __init__(self, policy: HFPolicy) -> None:
        super().__init__()
        self._policy = (policy,)
        self.vocab_size = policy.vocab_size
        self.hidden_size = policy.hidden_size

    def forward(self, tokens_BT: torch.Tensor, attention_mask_BT: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logits_BTV, hidden_BTD)`` of the base model."""
        policy = self._policy[0]
        with policy.adapters_disabled():
            return policy(tokens_BT, attention_mask_BT)  # type: ignore[no-any-return]

    def init_cache(self, batch_size: int, max_len: int) -> Any:
        return self._policy[0].init_cache(batch_size, max_len)

    def prefill(self, tokens_BT: torch.Tensor, attention_mask_BT: torch.Tensor | None,
                cache: Any) -> torch.Tensor:
        policy = self._policy[0]
        with policy.adapters_disabled():
            return policy.prefill(tokens_BT, attention_mask_BT, cache)

    def decode_step(self, tokens_B: torch.Tensor, cache: Any) -> torch.Tensor:
        policy = self._policy[0]
        with policy.adapters_disabled():
            return policy.decode_step(tokens_B, cache)


def reference_of(policy: Policy) -> Any:
    """The frozen KL reference for ``policy`` as it is now: `AdapterDisabled` for a PEFT
    (LoRA) policy, else a deep copy (frozen, eval mode). The adapter view equals the policy at
    the start because PEFT initialises LoRA's B to zero (the adapters start as a no-op)."""
    from rlscope.policy.hf import HFPolicy

    if isinstance(policy, HFPolicy) and policy.has_adapters:
        return AdapterDisabled(policy)
    return copy.deepcopy(policy).requires_grad_(False).eval()  # type: ignore[attr-defined]


__all__ = ["MODEL_ARCHS", "AdapterDisabled", "ModelConfig", "Policy", "TinyConfig",
           "TinyTransformer", "ValueHead", "add_lora", "build_policy", "position_ids_from_mask",
           "reference_of"]
