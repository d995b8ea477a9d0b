"""Policies: the `Policy` protocol, the built-in tiny transformer, the Hugging Face adapter,
and the value head. `build_policy` turns a `ModelConfig` into a policy."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlscope.policy.base import Policy, position_ids_from_mask
from rlscope.policy.tiny import TinyConfig, TinyTransformer
from rlscope.policy.value_head import ValueHead

MODEL_ARCHS = ("tiny", "llama", "qwen2", "hf")


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
    dtype: str = "float32"
    """Parameter dtype: float32 or float64 (tests use float64 for exact identities)."""

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
        if self.dtype not in ("float32", "float64"):
            errors.append(f"model.dtype={self.dtype!r}: use float32 or float64")
        return errors


def build_policy(cfg: ModelConfig, vocab_size: int, max_len: int) -> Policy:
    """A freshly initialised policy (seed the global torch RNG first for reproducibility)."""
    dtype = getattr(torch, cfg.dtype)
    if cfg.arch == "tiny":
        tiny = TinyConfig(vocab_size=vocab_size, max_len=max_len, d_model=cfg.d_model,
                          n_heads=cfg.n_heads, n_layers=cfg.n_layers)
        return TinyTransformer(tiny).to(dtype)
    from rlscope.policy.hf import HFPolicy, load_hf_model, tiny_hf_model

    if cfg.arch == "hf":
        return HFPolicy(load_hf_model(cfg.path)).to(dtype)
    model = tiny_hf_model(cfg.arch, vocab_size, seed=None, hidden_size=cfg.d_model,
                          num_layers=cfg.n_layers, num_heads=cfg.n_heads, max_len=max_len)
    return HFPolicy(model).to(dtype)


__all__ = ["MODEL_ARCHS", "ModelConfig", "Policy", "TinyConfig", "TinyTransformer", "ValueHead",
           "build_policy", "position_ids_from_mask"]
