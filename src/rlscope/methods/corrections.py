"""Off-policy corrections between the sampler and the learner (METHODS.md, "Off-policy
corrections"; METHODS_2026.md §2–§3).

The sampler (e.g. an inference engine) and the learner compute slightly different log-probs of
the same tokens. A correction is a pure function
``(logp_learner_old_BT, logp_sampler_BT, mask_BT, cfg) -> (weight_BT, stats)`` whose detached
(B, T) weight multiplies the per-token loss; ρ_c,t = π_learner_old(a_t)/π_sampler(a_t) =
exp(ℓ_o,t − ℓ_s,t) (the "decoupled" ratio). Sequence variants use one ratio per sequence over
its valid (mask = 1) tokens, broadcast to its tokens. ``stats`` are per-token detached tensors:
``is_ratio`` (the ratio the correction compares: per token, or its sequence's), ``is_high`` and
``is_low`` (that ratio above / below the kept range), and ``is_capped`` (truncate) or
``is_masked`` (mask). `correction_metrics` turns them into the ``sampler/`` metrics.

When ℓ_s = ℓ_o every ratio is exactly 1 and every correction returns w ≡ 1 (bit-for-bit), given
C ≥ 1 ≥ C_min and a band containing 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlscope.methods.component import Component
from rlscope.metrics.estimators import EPS, masked_max, masked_mean, masked_min

CorrectionOut = tuple[torch.Tensor, dict[str, torch.Tensor]]


@dataclass(frozen=True)
class CorrectionConfig:
    """Sampler-vs-learner importance correction (``is_correction``)."""

    name: str = "none"
    cap: float = 2.0
    """C of the truncate variants: the weight is min(ρ, C)."""
    cap_low: float = 0.0
    """C_min of the truncate variants: the weight is clamp(ρ, C_min, C) (TRL's ``clip_min``);
    0 = no lower bound (ρ > 0 always)."""
    band_low: float = 0.5
    """C_min of the mask variants: ratios below it are dropped (0 = no lower bound)."""
    band_high: float = 5.0
    """C_max of the mask variants: ratios above it are dropped."""
    geometric: bool = False
    """Sequence variants: the geometric mean of the token ratios instead of their product."""
    keep_ratio: bool = False
    """Mask variants: weight ρ·1[C_min ≤ ρ ≤ C_max] (TRL, IcePop, verl's MIS) instead of the
    indicator 1[C_min ≤ ρ ≤ C_max] alone."""

    def validate(self) -> list[str]:
        errors: list[str] = []
        if not self.cap > 0:
            errors.append(f"method.is_correction_cap={self.cap} must be > 0")
        elif not 0 <= self.cap_low < self.cap:
            errors.append(f"method.is_correction_cap_low={self.cap_low} must lie in "
                          f"[0, is_correction_cap={self.cap}) (0 = no lower bound)")
        if not 0 <= self.band_low < self.band_high:
            errors.append(f"method.is_band_low={self.band_low} and method.is_band_high="
                          f"{self.band_high} need 0 <= is_band_low < is_band_high")
        reads = CORRECTIONS[self.name].settings if self.name in CORRECTIONS else ()
        if self.keep_ratio and "keep_ratio" not in reads:
            errors.append(f"method.is_keep_ratio only acts with a mask correction "
                          f"(is_correction={self.name!r}): drop it or use token_mask or "
                          "sequence_mask")
        if self.cap_low > 0 and "cap_low" not in reads:
            errors.append(f"method.is_correction_cap_low only acts with a truncate correction "
                          f"(is_correction={self.name!r}): drop it or use token_truncate or "
                          "sequence_truncate")
        return errors


def _check(logp_old_BT: torch.Tensor, logp_sampler_BT: torch.Tensor,
           mask_BT: torch.Tensor) -> None:
    if logp_old_BT.dim() != 2 or logp_old_BT.shape != logp_sampler_BT.shape \
            or logp_old_BT.shape != mask_BT.shape:
        raise ValueError("corrections need (B, T) log-probs and mask of one shape, got "
                         f"{tuple(logp_old_BT.shape)}, {tuple(logp_sampler_BT.shape)}, "
                         f"{tuple(mask_BT.shape)}")


def _token_log_ratio(logp_old_BT: torch.Tensor, logp_sampler_BT: torch.Tensor,
                     mask_BT: torch.Tensor) -> torch.Tensor:
    """log ρ_t, 0 at masked positions (so padding never leaks into sums)."""
    _check(logp_old_BT, logp_sampler_BT, mask_BT)
    diff_BT = (logp_old_BT - logp_sampler_BT).detach()
    return torch.where(mask_BT > 0, diff_BT, torch.zeros_like(diff_BT))


def _sequence_ratio(logp_old_BT: torch.Tensor, logp_sampler_BT: torch.Tensor,
                    mask_BT: torch.Tensor, geometric: bool) -> torch.Tensor:
    """Per-sequence ratio broadcast to (B, T): exp Σ_t log ρ_t, or exp of their mean."""
    log_rho_BT = _token_log_ratio(logp_old_BT, logp_sampler_BT, mask_BT)
    log_seq_B = log_rho_BT.sum(-1)
    if geometric:
        log_seq_B = log_seq_B / mask_BT.to(log_seq_B.dtype).sum(-1).clamp_min(1.0)
    return log_seq_B.exp()[:, None].expand_as(log_rho_BT)


def _truncate(rho_BT: torch.Tensor, cfg: CorrectionConfig) -> CorrectionOut:
    """w = clamp(ρ, C_min, C); the lower bound only where C_min > 0, so the default is min(ρ, C)
    exactly."""
    high_BT = (rho_BT > cfg.cap).to(rho_BT.dtype)
    low_BT = (rho_BT < cfg.cap_low).to(rho_BT.dtype)
    weight_BT = rho_BT.clamp(min=cfg.cap_low, max=cfg.cap) if cfg.cap_low > 0 \
        else rho_BT.clamp(max=cfg.cap)
    return weight_BT, {"is_ratio": rho_BT, "is_high": high_BT, "is_low": low_BT,
                       "is_capped": high_BT + low_BT}


def _mask(rho_BT: torch.Tensor, cfg: CorrectionConfig) -> CorrectionOut:
    """w = 1[C_min ≤ ρ ≤ C_max], or ρ·1[C_min ≤ ρ ≤ C_max] with ``keep_ratio`` (a dropped ρ
    may be inf: it is replaced, never multiplied by 0)."""
    high_BT = (rho_BT > cfg.band_high).to(rho_BT.dtype)
    low_BT = (rho_BT < cfg.band_low).to(rho_BT.dtype)
    keep_BT = 1.0 - high_BT - low_BT
    weight_BT = torch.where(keep_BT > 0, rho_BT, torch.zeros_like(rho_BT)) if cfg.keep_ratio \
        else keep_BT
    return weight_BT, {"is_ratio": rho_BT, "is_high": high_BT, "is_low": low_BT,
                       "is_masked": 1.0 - keep_BT}


def no_correction(logp_old_BT: torch.Tensor, logp_sampler_BT: torch.Tensor,
                  mask_BT: torch.Tensor, cfg: CorrectionConfig) -> CorrectionOut:
    """w = 1 (sampler and learner treated as the same policy)."""
    _check(logp_old_BT, logp_sampler_BT, mask_BT)
    return torch.ones_like(logp_old_BT), {}


def token_truncate(logp_old_BT: torch.Tensor, logp_sampler_BT: torch.Tensor,
                   mask_BT: torch.Tensor, cfg: CorrectionConfig) -> CorrectionOut:
    """Truncated token IS (TIS, Yao et al. 2025): w_t = clamp(ρ_t, C_min, C), C_min = 0 by
    default (min(ρ_t, C)). Regime: 0 ≤ C_min < C. Logs ``is_ratio``, ``is_capped``."""
    return _truncate(_token_log_ratio(logp_old_BT, logp_sampler_BT, mask_BT).exp(), cfg)


def token_mask(logp_old_BT: torch.Tensor, logp_sampler_BT: torch.Tensor,
               mask_BT: torch.Tensor, cfg: CorrectionConfig) -> CorrectionOut:
    """Masked token IS: w_t = 1[C_min ≤ ρ_t ≤ C_max]; with ``keep_ratio`` w_t = ρ_t·1[…]
    (IcePop's two-sided mask, Ling Team 2510.18855).

    Regime: 0 ≤ C_min ≤ 1 ≤ C_max. Logs ``is_ratio``, ``is_masked``.
    """
    return _mask(_token_log_ratio(logp_old_BT, logp_sampler_BT, mask_BT).exp(), cfg)


def sequence_truncate(logp_old_BT: torch.Tensor, logp_sampler_BT: torch.Tensor,
                      mask_BT: torch.Tensor, cfg: CorrectionConfig) -> CorrectionOut:
    """Truncated sequence IS: w = clamp(ρ_seq, C_min, C), ρ_seq = Π_t ρ_t (geometric:
    (Π_t ρ_t)^(1/|y|)), broadcast to the sequence's tokens. Regime: 0 ≤ C_min < C. Logs
    ``is_ratio``, ``is_capped``."""
    return _truncate(_sequence_ratio(logp_old_BT, logp_sampler_BT, mask_BT, cfg.geometric), cfg)


def sequence_mask(logp_old_BT: torch.Tensor, logp_sampler_BT: torch.Tensor,
                  mask_BT: torch.Tensor, cfg: CorrectionConfig) -> CorrectionOut:
    """Masked sequence IS: every token of a sequence is dropped when ρ_seq (product, or geometric
    mean) is outside [C_min, C_max]; with ``keep_ratio`` the kept ones weigh ρ_seq (TRL's
    ``sequence_mask``). Logs ``is_ratio``, ``is_masked``."""
    return _mask(_sequence_ratio(logp_old_BT, logp_sampler_BT, mask_BT, cfg.geometric), cfg)


Correction = Component[[torch.Tensor, torch.Tensor, torch.Tensor, CorrectionConfig],
                       CorrectionOut]

CORRECTIONS: dict[str, Correction] = {
    "none": Component(no_correction, identity=True),
    "token_truncate": Component(token_truncate, ("cap", "cap_low")),
    "token_mask": Component(token_mask, ("band_low", "band_high", "keep_ratio")),
    "sequence_truncate": Component(sequence_truncate, ("cap", "cap_low", "geometric")),
    "sequence_mask": Component(sequence_mask, ("band_low", "band_high", "geometric",
                                               "keep_ratio")),
}


def acted_BT(stats: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """Where a correction acted: the tokens it capped (truncate) or dropped (mask)."""
    return stats.get("is_capped", stats.get("is_masked"))


def weight_ess(weight_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """Normalised effective sample size 1/mean(ŵ²), ŵ = w/mean(w), over valid tokens; equal to
    (Σw)²/(N·Σw²). 1 for equal weights, 1/N for a single non-zero weight, 0 when every weight is
    0. w = (1, 1, 2, 0): 16/(4·6) = 0.666667."""
    w_BT = weight_BT * mask_BT
    n = mask_BT.sum().clamp_min(1.0)
    return w_BT.sum().square() / (n * w_BT.square().sum()).clamp_min(EPS)


CORRECTION_METRICS = ("sampler/is_mean", "sampler/is_max", "sampler/is_min",
                      "sampler/correction_weight_mean", "sampler/correction_ess",
                      "sampler/frac_high", "sampler/frac_low", "sampler/masked_frac",
                      "sampler/seq_masked_frac", "sampler/correction_active_frac",
                      "sampler/chi2_token", "sampler/k3", "sampler/seq_log_ratio")
"""What `correction_metrics` returns for every correction but ``none``."""


def correction_metrics(logp_old_BT: torch.Tensor, logp_sampler_BT: torch.Tensor,
                       mask_BT: torch.Tensor, weight_BT: torch.Tensor,
                       stats: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The ``sampler/`` metrics of a correction (METHODS_2026.md §2), all (B, T) inputs, means
    over valid tokens unless said: ``is_mean``/``is_max``/``is_min`` of the token ratio ρ_c;
    ``chi2_token`` = mean ρ_c² − 1; ``k3`` = mean (ρ_c − 1 − log ρ_c), the k3 estimate of
    KL(π_sampler‖π_learner) on the sampled tokens; ``seq_log_ratio`` = mean over sequences with
    a valid token of Σ_t log ρ_c,t; ``frac_high``/``frac_low``: the ratio the correction compares
    (``stats["is_ratio"]``) above C or the band / below C_min or the band;
    ``masked_frac``: tokens with weight 0; ``seq_masked_frac``: sequences with a weight-0 token;
    ``correction_weight_mean``, ``correction_ess`` (`weight_ess`) of the weight w, and
    ``correction_active_frac`` (capped or dropped tokens). Every value is 1 (means, ESS) or
    0 (fractions, χ², k3, log-ratio) when ℓ_s = ℓ_o."""
    log_rho_BT = _token_log_ratio(logp_old_BT, logp_sampler_BT, mask_BT)
    rho_BT = log_rho_BT.exp()
    valid_B = mask_BT.sum(-1) > 0
    dropped_BT = (weight_BT == 0).to(mask_BT.dtype) * mask_BT
    out = {
        "sampler/is_mean": masked_mean(rho_BT, mask_BT),
        "sampler/is_max": masked_max(rho_BT, mask_BT),
        "sampler/is_min": masked_min(rho_BT, mask_BT),
        "sampler/chi2_token": masked_mean(rho_BT.square(), mask_BT) - 1.0,
        "sampler/k3": masked_mean(torch.expm1(log_rho_BT) - log_rho_BT, mask_BT),
        "sampler/seq_log_ratio": log_rho_BT.sum() / valid_B.sum().clamp_min(1),
        "sampler/masked_frac": masked_mean(dropped_BT, mask_BT),
        "sampler/seq_masked_frac": (dropped_BT.sum(-1) > 0).to(mask_BT.dtype).sum()
        / valid_B.sum().clamp_min(1),
        "sampler/correction_weight_mean": masked_mean(weight_BT, mask_BT),
        "sampler/correction_ess": weight_ess(weight_BT, mask_BT),
    }
    for key in ("high", "low"):
        if f"is_{key}" in stats:
            out[f"sampler/frac_{key}"] = masked_mean(stats[f"is_{key}"], mask_BT)
    if (active_BT := acted_BT(stats)) is not None:
        out["sampler/correction_active_frac"] = masked_mean(active_BT, mask_BT)
    return out
