"""The 2025–2026 per-token objectives of METHODS_2026.md §3: GSPO-token, GMPO, DPPO (TV and
binary KL) and the covariance rules Clip-Cov and KL-Cov.

Same contract as `rlscope.methods.objectives`: ``(PolicyTerms, ObjectiveConfig) -> (loss_BT,
stats)``. Clip-Cov and KL-Cov act on a token selection chosen over the whole optimizer batch
(a batch statistic, `rlscope.methods.batch_stats`), which they read as
``PolicyTerms.select_BT``.
"""

from __future__ import annotations

import torch

from rlscope.methods.batch_stats import clip_cov_select, kl_cov_select
from rlscope.methods.component import Component
from rlscope.methods.configs import ObjectiveConfig
from rlscope.methods.terms import (
    LOG_RATIO_CLAMP,
    Objective,
    ObjectiveOut,
    PolicyTerms,
    clipped_surrogate,
    on_first_token,
    ratio,
    require,
)

_BINARY_EPS = 1e-12


def _row_mean_B(x_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """Mean of ``x_BT`` over each row's valid tokens, shape [B] (0 for an empty row)."""
    return (x_BT * mask_BT).sum(-1) / mask_BT.sum(-1).clamp_min(1.0)


def gspo_token(x: PolicyTerms, cfg: ObjectiveConfig) -> ObjectiveOut:
    """GSPO-token: `gspo`'s clipped surrogate with s_i,t = sg(s_i)·exp(ℓ_t − sg ℓ_t).

    Zheng et al. 2507.18071 (TRL ``importance_sampling_level="sequence_token"``). The value is
    the sequence ratio s_i = exp(mean_t m_t(ℓ_t − ℓ_μ,t)) (detached), the gradient flows only
    through each token's own ℓ_t, so a token-varying advantage A_t reaches its own token.
    With a constant advantage per row its gradient equals `gspo`'s. Regime: as `gspo`; it
    differs only with token-level advantages (gae, rtg, tempo). Clip stats as `ppo_clip`.
    """
    mask_BT = x.mask_BT.to(x.logp_BT.dtype)
    d_BT = (x.logp_BT - x.logp_old_BT).detach()
    log_s_B = _row_mean_B(d_BT, mask_BT).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    s_BT = torch.exp(log_s_B)[:, None] * torch.exp(x.logp_BT - x.logp_BT.detach())
    return clipped_surrogate(s_BT, x.weight_BT.detach(), cfg)


def gmpo(x: PolicyTerms, cfg: ObjectiveConfig) -> ObjectiveOut:
    """GMPO: L_i = −A_i · exp(mean_t d̃_t), the geometric mean of token ratios, one-sided clip.

    Zhao et al. 2507.20673 (TRL ``GMPOTrainer``, verl ``geo_mean``). d_t = ℓ_t − ℓ_μ,t is
    clipped in **log space** to [−ε_low, ε_high] (``clip_low``/``clip_high``, 0.4 each):
    d̃ = min(d, clamp(d)) if A_i > 0, else max(d, clamp(d)), so a clipped token gets no
    gradient. A_i is the row's mean advantage (as verl). L_i sits on the row's first valid
    token (`on_first_token`): aggregate with ``seq_mean_token_sum`` to get mean_i L_i.
    On-policy its gradient equals `ppo_clip`'s with ``seq_mean_token_mean``. Clip fractions:
    ``low`` (d < −ε_low, A < 0), ``high`` (d > ε_high, A > 0), ``region`` (either).
    """
    mask_BT = x.mask_BT.to(x.logp_BT.dtype)
    adv_B = _row_mean_B(x.weight_BT.detach(), mask_BT)
    d_BT = (x.logp_BT - x.logp_old_BT).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    clamped_BT = d_BT.clamp(-cfg.clip_low, cfg.clip_high)
    pos_BT = (adv_B > 0)[:, None].expand_as(d_BT)
    d_clip_BT = torch.where(pos_BT, torch.minimum(d_BT, clamped_BT),
                            torch.maximum(d_BT, clamped_BT))
    seq_loss_B = -adv_B * torch.exp(_row_mean_B(d_clip_BT, mask_BT))
    d_d = d_BT.detach()
    low_BT = ((d_d < -cfg.clip_low) & ~pos_BT & (adv_B < 0)[:, None]).to(d_d.dtype)
    high_BT = ((d_d > cfg.clip_high) & pos_BT).to(d_d.dtype)
    return on_first_token(seq_loss_B, mask_BT), {
        "clipfrac_low": low_BT, "clipfrac_high": high_BT,
        "clipfrac_region": torch.maximum(low_BT, high_BT)}


def _binary_kl(p_mu_BT: torch.Tensor, p_BT: torch.Tensor) -> torch.Tensor:
    """KL of Bernoulli(p_μ) from Bernoulli(p): p_μ ln(p_μ/p) + (1−p_μ) ln((1−p_μ)/(1−p))."""
    q_mu_BT = (1.0 - p_mu_BT).clamp_min(_BINARY_EPS)
    q_BT = (1.0 - p_BT).clamp_min(_BINARY_EPS)
    return (torch.xlogy(p_mu_BT, p_mu_BT) - p_mu_BT * torch.log(p_BT.clamp_min(_BINARY_EPS))
            + q_mu_BT * (torch.log(q_mu_BT) - torch.log(q_BT)))


def _dppo(x: PolicyTerms, cfg: ObjectiveConfig, kl: bool) -> ObjectiveOut:
    adv_BT = x.weight_BT.detach()
    p_BT = x.logp_BT.detach().exp()
    p_mu_BT = x.logp_old_BT.exp()
    diff_BT = p_BT - p_mu_BT
    k_BT = _binary_kl(p_mu_BT, p_BT)
    pos_BT = adv_BT > 0
    if kl:
        out_pos_BT = pos_BT & (k_BT > cfg.dppo_delta_high) & (diff_BT > 0)
        out_neg_BT = ~pos_BT & (k_BT > cfg.dppo_delta_low) & (diff_BT < 0)
    else:
        out_pos_BT = pos_BT & (diff_BT > cfg.dppo_delta_high)
        out_neg_BT = ~pos_BT & (diff_BT < -cfg.dppo_delta_low)
    keep_BT = (~(out_pos_BT | out_neg_BT)).to(p_BT.dtype)
    iw_BT = ratio(x.logp_BT, x.logp_old_BT).detach().clamp_max(cfg.cap)
    loss_BT = -x.logp_BT * (adv_BT * iw_BT * keep_BT)
    # the masked fractions are over the tokens with A ≠ 0 (METHODS_2026.md): NaN marks the
    # others, outside the statistic's population (`rlscope.metrics.estimators.population_mean`)
    outside_BT = torch.where(adv_BT != 0, 0.0, float("nan")).to(p_BT.dtype)
    return loss_BT, {"masked_frac_pos": out_pos_BT.to(p_BT.dtype) + outside_BT,
                     "masked_frac_neg": out_neg_BT.to(p_BT.dtype) + outside_BT,
                     "tv_mean": diff_BT.abs(), "binary_kl_mean": k_BT, "iw_mean": iw_BT}


def dppo_tv(x: PolicyTerms, cfg: ObjectiveConfig) -> ObjectiveOut:
    """DPPO-TV: −A_t · sg(min(ρ_t, c) · M_t) · ℓ_t, M_t = 0 where |p − p_μ| leaves the region.

    Qi et al. 2602.04879 (sail-sg/Stable-RL), binary approximation: p = π(a_t), p_μ = μ(a_t);
    the token is masked when A > 0 and p − p_μ > δ_high, or A ≤ 0 and p − p_μ < −δ_low
    (``dppo_delta_low``/``dppo_delta_high``; c = ``cap``). On-policy (p = p_μ) it is
    REINFORCE. Regime: groups; off-policy capable. Logs ``masked_frac_pos``/``neg`` (masked
    tokens with A > 0 / A < 0, as a fraction of the valid tokens with A ≠ 0; NaN marks the
    others), ``tv_mean``, ``binary_kl_mean``.
    """
    return _dppo(x, cfg, kl=False)


def dppo_kl(x: PolicyTerms, cfg: ObjectiveConfig) -> ObjectiveOut:
    """DPPO-KL: as `dppo_tv` with the binary KL K = p_μ ln(p_μ/p) + (1−p_μ) ln((1−p_μ)/(1−p)).

    Masked when A > 0, K > δ_high and p > p_μ, or A ≤ 0, K > δ_low and p < p_μ
    (Qi et al. 2602.04879). Same stats as `dppo_tv`.
    """
    return _dppo(x, cfg, kl=True)


def clip_cov(x: PolicyTerms, cfg: ObjectiveConfig) -> ObjectiveOut:
    """Clip-Cov: `ppo_clip` (no dual clip) whose selected tokens get no gradient.

    Cui et al. 2505.22617 (PRIME-RL/Entropy-Mechanism-of-RL; verl ``clip_cov``). The
    selection (``select_BT``, chosen over the optimizer batch by
    `rlscope.methods.batch_stats.clip_cov_select`) is k = max(1, ⌊r·N⌋) tokens drawn among
    those with ω_low < C_t < ω_high whose clipped branch is inactive, C_t = (A_t − Ā)(ℓ_t − ℓ̄).
    With no selected token it is `ppo_clip` exactly. Regime: groups; N·r ≥ 1 to matter.
    """
    select_BT = require(x.select_BT, "select_BT", "clip_cov")
    adv_BT = x.weight_BT.detach()
    loss_BT, stats = clipped_surrogate(ratio(x.logp_BT, x.logp_old_BT), adv_BT,
                                       ObjectiveConfig(clip_low=cfg.clip_low,
                                                       clip_high=cfg.clip_high))
    return loss_BT * (1.0 - select_BT), stats


def kl_cov(x: PolicyTerms, cfg: ObjectiveConfig) -> ObjectiveOut:
    """KL-Cov: −A_t ρ_t (no clipping) plus β|ℓ_t − ℓ_μ,t| on the selected tokens.

    Cui et al. 2505.22617. The selection (``select_BT``,
    `rlscope.methods.batch_stats.kl_cov_select`) is the k = max(1, ⌊k_r·N⌋) tokens of the
    optimizer batch with the largest C_t. β = ``kl_cov_coef``; β = 0 is the unclipped
    surrogate. Regime: groups. Logs ``kl_cov_penalty`` (β|d| on the selected tokens).
    """
    select_BT = require(x.select_BT, "select_BT", "kl_cov")
    penalty_BT = cfg.kl_cov_coef * (x.logp_BT - x.logp_old_BT).abs() * select_BT
    loss_BT = -ratio(x.logp_BT, x.logp_old_BT) * x.weight_BT.detach() + penalty_BT
    return loss_BT, {"kl_cov_penalty": penalty_BT.detach()}


_CLIP = ("clip_low", "clip_high", "dual_clip")
OBJECTIVES_2026: dict[str, Objective] = {
    "gspo_token": Component(gspo_token, _CLIP),
    "gmpo": Component(gmpo, _CLIP[:2], own_aggregation="seq_mean_token_sum"),
    "dppo_tv": Component(dppo_tv, ("dppo_delta_low", "dppo_delta_high", "cap")),
    "dppo_kl": Component(dppo_kl, ("dppo_delta_low", "dppo_delta_high", "cap")),
    "clip_cov": Component(clip_cov, ("clip_low", "clip_high", "clip_cov_ratio",
                                     "clip_cov_low", "clip_cov_high"),
                          batch_statistic=clip_cov_select),
    "kl_cov": Component(kl_cov, ("kl_cov_ratio", "kl_cov_coef"), batch_statistic=kl_cov_select),
}
