"""Off-policy corrections between the sampler and the learner (METHODS.md, "Off-policy
corrections").

The sampler (e.g. an inference engine) and the learner compute slightly different log-probs of
the same tokens. A correction is a pure function
``(logp_learner_old_BT, logp_sampler_BT, mask_BT, cfg) -> (weight_BT, stats)`` whose detached
(B, T) weight multiplies the per-token loss; ρ_t = π_learner_old(a_t)/π_sampler(a_t) =
exp(ℓ_old,t − ℓ_sampler,t). Sequence variants use one ratio per sequence over its valid
(mask = 1) tokens, broadcast to its tokens. ``stats`` are per-token detached tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlscope.methods.component import Component

CorrectionOut = tuple[torch.Tensor, dict[str, torch.Tensor]]


@dataclass(frozen=True)
class CorrectionConfig:
    """Sampler-vs-learner importance correction (``is_correction``)."""

    name: str = "none"
    cap: float = 2.0
    """C of the truncate variants: the weight is min(ρ, C)."""
    band_low: float = 0.5
    """C_min of the mask variants: ratios below it are dropped."""
    band_high: float = 5.0
    """C_max of the mask variants: ratios above it are dropped."""
    geometric: bool = False
    """Sequence variants: the geometric mean of the token ratios instead of their product."""

    def validate(self) -> list[str]:
        if self.cap <= 0 or not 0 < self.band_low < self.band_high:
            return ["method.is_correction_cap must be > 0 and 0 < is_band_low < is_band_high"]
        return []


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


def no_correction(logp_old_BT: torch.Tensor, logp_sampler_BT: torch.Tensor,
                  mask_BT: torch.Tensor, cfg: CorrectionConfig) -> CorrectionOut:
    """w = 1 (sampler and learner treated as the same policy)."""
    _check(logp_old_BT, logp_sampler_BT, mask_BT)
    return torch.ones_like(logp_old_BT), {}


def token_truncate(logp_old_BT: torch.Tensor, logp_sampler_BT: torch.Tensor,
                   mask_BT: torch.Tensor, cfg: CorrectionConfig) -> CorrectionOut:
    """Truncated token IS: w_t = min(ρ_t, C). Regime: C > 0. Logs ``is_ratio``, ``is_capped``."""
    rho_BT = _token_log_ratio(logp_old_BT, logp_sampler_BT, mask_BT).exp()
    capped_BT = (rho_BT > cfg.cap).to(rho_BT.dtype)
    return rho_BT.clamp(max=cfg.cap), {"is_ratio": rho_BT, "is_capped": capped_BT}


def token_mask(logp_old_BT: torch.Tensor, logp_sampler_BT: torch.Tensor,
               mask_BT: torch.Tensor, cfg: CorrectionConfig) -> CorrectionOut:
    """Masked token IS: w_t = 1[C_min ≤ ρ_t ≤ C_max] (the ratio itself is not applied).

    Regime: 0 ≤ C_min ≤ 1 ≤ C_max. Logs ``is_ratio``, ``is_masked``.
    """
    rho_BT = _token_log_ratio(logp_old_BT, logp_sampler_BT, mask_BT).exp()
    keep_BT = ((rho_BT >= cfg.band_low) & (rho_BT <= cfg.band_high)).to(rho_BT.dtype)
    return keep_BT, {"is_ratio": rho_BT, "is_masked": 1.0 - keep_BT}


def sequence_truncate(logp_old_BT: torch.Tensor, logp_sampler_BT: torch.Tensor,
                      mask_BT: torch.Tensor, cfg: CorrectionConfig) -> CorrectionOut:
    """Truncated sequence IS: w = min(ρ_seq, C), ρ_seq = Π_t ρ_t (geometric: (Π_t ρ_t)^(1/|y|)),
    broadcast to the sequence's tokens. Regime: C > 0. Logs ``is_ratio``, ``is_capped``."""
    rho_BT = _sequence_ratio(logp_old_BT, logp_sampler_BT, mask_BT, cfg.geometric)
    capped_BT = (rho_BT > cfg.cap).to(rho_BT.dtype)
    return rho_BT.clamp(max=cfg.cap), {"is_ratio": rho_BT, "is_capped": capped_BT}


def sequence_mask(logp_old_BT: torch.Tensor, logp_sampler_BT: torch.Tensor,
                  mask_BT: torch.Tensor, cfg: CorrectionConfig) -> CorrectionOut:
    """Masked sequence IS: every token of a sequence is dropped when ρ_seq (product, or geometric
    mean) is outside [C_min, C_max]. Logs ``is_ratio``, ``is_masked``."""
    rho_BT = _sequence_ratio(logp_old_BT, logp_sampler_BT, mask_BT, cfg.geometric)
    keep_BT = ((rho_BT >= cfg.band_low) & (rho_BT <= cfg.band_high)).to(rho_BT.dtype)
    return keep_BT, {"is_ratio": rho_BT, "is_masked": 1.0 - keep_BT}


Correction = Component[[torch.Tensor, torch.Tensor, torch.Tensor, CorrectionConfig],
                       CorrectionOut]

CORRECTIONS: dict[str, Correction] = {
    "none": Component(no_correction, identity=True),
    "token_truncate": Component(token_truncate, ("cap",)),
    "token_mask": Component(token_mask, ("band_low", "band_high")),
    "sequence_truncate": Component(sequence_truncate, ("cap", "geometric")),
    "sequence_mask": Component(sequence_mask, ("band_low", "band_high", "geometric")),
}


def acted_BT(stats: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """Where a correction acted: the tokens it capped (truncate) or dropped (mask)."""
    return stats.get("is_capped", stats.get("is_masked"))
