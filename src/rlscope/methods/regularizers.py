"""KL estimators, the KL and entropy coefficient controllers, entropy, and the value loss.

KL estimators (Schulman, "Approximating KL divergence", 2020) with d = ℓ − ℓ_target:
k1 = d, k2 = d²/2, k3 = exp(−d) + d − 1 (≥ 0 per token), abs = |d|; and ``full``, the exact
categorical KL Σ_v π(v)·(log π(v) − log π_target(v)) over the vocabulary (`kl_full`), which
needs both whole distributions rather than the sampled tokens' log-probs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlscope.methods.configs import EntropyConfig, KLConfig, ValueConfig
from rlscope.metrics.estimators import LOG_RATIO_CLAMP

SAMPLED_KL_ESTIMATORS = ("k1", "k2", "k3", "abs")
"""Estimators computed by `kl_estimate` from the sampled tokens' log-probs."""
KL_ESTIMATORS = (*SAMPLED_KL_ESTIMATORS, "full", "is_corrected")


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
    raise ValueError(f"unknown KL estimator {estimator!r}; valid: "
                     f"{', '.join(SAMPLED_KL_ESTIMATORS)} (full needs the whole distributions: "
                     "kl_full; is_corrected the behaviour log-probs: kl_is_corrected)")


def kl_is_corrected(logp_BT: torch.Tensor, logp_ref_BT: torch.Tensor,
                    logp_old_BT: torch.Tensor) -> torch.Tensor:
    """DeepSeek-V3.2's unbiased KL estimate KL_t = ρ_t·k3_t per token, ``[B, T]``.

    k3_t = exp(ℓ_ref − ℓ) − (ℓ_ref − ℓ) − 1 against the reference and ρ_t = exp(ℓ − ℓ_μ) to the
    behaviour log-probs (log-ratio clamped to ±20), **not** detached: ∂(ρ·k3)/∂ℓ = ρ·(ℓ − ℓ_ref),
    the importance-weighted gradient of KL(π‖π_ref) from samples of μ; at ρ = 1 the value is
    k3. Source: DeepSeek-V3.2 (2512.02556); TRL.
    """
    rho_BT = torch.exp((logp_BT - logp_old_BT).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    return rho_BT * kl_estimate(logp_BT, logp_ref_BT, "k3")


def kl_full(logp_BTV: torch.Tensor, logp_target_BTV: torch.Tensor) -> torch.Tensor:
    """Exact categorical KL(π ‖ π_target) = Σ_v π(v)·(log π(v) − log π_target(v)) per
    position, ``[B, T]``, from log-probabilities over the vocabulary ``[B, T, V]``.

    Tokens with π(v) = 0 contribute 0 (0·log 0 = 0), also where both log-probs are −inf, as
    outside a top-k/top-p kept set that both distributions share; the gradient there is 0, not
    nan. Valid when π_target(v) > 0 wherever π(v) > 0 (otherwise the KL is +inf). Gradient
    w.r.t. the logits z of π: ∂KL/∂z_v = π(v)·(log π(v) − log π_target(v) − KL).
    """
    p_BTV = logp_BTV.exp()
    diff_BTV = (logp_BTV - logp_target_BTV).masked_fill(p_BTV == 0, 0.0)
    return (p_BTV * diff_BTV).sum(-1)


def full_kl(logits_BTV: torch.Tensor, logits_target_BTV: torch.Tensor) -> torch.Tensor:
    """Exact categorical KL(π ‖ π_target) per position from logits, ``[B, T]``.

    Computed in at least float32 (half-precision logits are upcast; float64 stays float64).
    """
    dtype = torch.promote_types(logits_BTV.dtype, torch.float32)
    return kl_full(logits_BTV.to(dtype).log_softmax(-1),
                   logits_target_BTV.to(dtype).log_softmax(-1))


def entropy_from_logp(logp_BTV: torch.Tensor) -> torch.Tensor:
    """Categorical entropy per position, ``[B, T]`` (0·log 0 treated as 0)."""
    p_BTV = logp_BTV.exp()
    return -(p_BTV * logp_BTV.masked_fill(p_BTV == 0, 0.0)).sum(-1)


def adaptive_kl_update(beta: float, kl: float, n_samples: int, cfg: KLConfig) -> float:
    """Ziegler et al. (1909.08593) controller: e = clip(KL/target − 1, ±0.2),
    β ← β · (1 + e · n_samples / horizon). ``kl`` is the mean per-sequence KL."""
    error = min(max(kl / cfg.target_value - 1.0, -0.2), 0.2)
    return beta * (1.0 + error * n_samples / cfg.horizon)


def kl_warmup_beta(step: int, cfg: KLConfig) -> float:
    """The β of the warm-up schedule at loop step ``step``: 0 for the first
    ``cfg.warmup_steps`` steps (the policy moves freely off the reference), then ``cfg.coef``.
    A pure function of the step, so a resumed run continues it exactly."""
    return 0.0 if step < cfg.warmup_steps else cfg.coef


def adaptive_entropy_update(coef: float, entropy_history: Sequence[float],
                            cfg: EntropyConfig) -> float:
    """Adaptive entropy-bonus coefficient (after Skywork-OR1, He et al. 2505.22312).

    With H̄ the mean of the last ``cfg.window`` values of ``entropy_history`` (the per-step
    token-mean ``policy/entropy``, oldest first, this step's last; fewer at the start):
    c ← c + δ if H̄ < target, else c ← max(c − δ, 0). Valid for δ > 0 and a non-empty history;
    c stays ≥ 0 and moves by at most δ per step.
    """
    if not entropy_history:
        raise ValueError("adaptive_entropy_update needs at least one entropy value")
    recent = list(entropy_history)[-cfg.window:]
    mean = sum(recent) / len(recent)
    if mean < cfg.target:
        return coef + cfg.delta
    return max(coef - cfg.delta, 0.0)


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
