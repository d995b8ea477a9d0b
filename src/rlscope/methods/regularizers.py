"""KL estimators, the adaptive KL controller, entropy, and the value loss.

KL estimators (Schulman, "Approximating KL divergence", 2020) with d = ℓ − ℓ_target:
k1 = d, k2 = d²/2, k3 = exp(−d) + d − 1 (≥ 0 per token), abs = |d|.
"""

from __future__ import annotations

import torch

from rlscope.methods.spec import KLConfig, ValueConfig

KL_ESTIMATORS = ("k1", "k2", "k3", "abs")


def kl_estimate(logp_BT: torch.Tensor, logp_target_BT: torch.Tensor,
                estimator: str) -> torch.Tensor:
    """Per-token KL estimate of π against the target from sampled-token log-probs."""
    d_BT = logp_BT - logp_target_BT
    if estimator == "k1":
        return d_BT
    if estimator == "k2":
        return 0.5 * d_BT.square()
    if estimator == "k3":
        return torch.expm1(-d_BT) + d_BT
    if estimator == "abs":
        return d_BT.abs()
    raise ValueError(f"unknown KL estimator {estimator!r}; valid: {', '.join(KL_ESTIMATORS)}")


def full_kl(logits_BTV: torch.Tensor, logits_target_BTV: torch.Tensor) -> torch.Tensor:
    """Exact categorical KL(π ‖ π_target) per position from logits, ``[B, T]``.

    Computed in at least float32 (half-precision logits are upcast; float64 stays float64).
    """
    dtype = torch.promote_types(logits_BTV.dtype, torch.float32)
    logp_BTV = logits_BTV.to(dtype).log_softmax(-1)
    logq_BTV = logits_target_BTV.to(dtype).log_softmax(-1)
    return (logp_BTV.exp() * (logp_BTV - logq_BTV)).sum(-1)


def entropy_from_logp(logp_BTV: torch.Tensor) -> torch.Tensor:
    """Categorical entropy per position, ``[B, T]`` (0·log 0 treated as 0)."""
    p_BTV = logp_BTV.exp()
    return -(p_BTV * logp_BTV.masked_fill(p_BTV == 0, 0.0)).sum(-1)


def adaptive_kl_update(beta: float, kl: float, n_samples: int, cfg: KLConfig) -> float:
    """Ziegler et al. (1909.08593) controller: e = clip(KL/target − 1, ±0.2),
    β ← β · (1 + e · n_samples / horizon). ``kl`` is the mean per-sequence KL."""
    error = min(max(kl / cfg.target_value - 1.0, -0.2), 0.2)
    return beta * (1.0 + error * n_samples / cfg.horizon)


def value_loss(values_BT: torch.Tensor, old_values_BT: torch.Tensor, returns_BT: torch.Tensor,
               cfg: ValueConfig) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss ½·max((V − R)², (V_old + clip(V − V_old, ±c) − R)²), per token."""
    err_BT = (values_BT - returns_BT).square()
    if cfg.clip <= 0:
        return 0.5 * err_BT, {}
    clipped_BT = old_values_BT + (values_BT - old_values_BT).clamp(-cfg.clip, cfg.clip)
    err_clip_BT = (clipped_BT - returns_BT).square()
    return 0.5 * torch.maximum(err_BT, err_clip_BT), {
        "value_clipfrac": (err_clip_BT > err_BT).float().detach()}
