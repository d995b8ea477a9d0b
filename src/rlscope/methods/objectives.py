"""Per-token policy objectives (METHODS.md, "Objectives").

An objective is a pure function ``(PolicyTerms, ObjectiveConfig) -> (loss_BT, stats)``:
``loss_BT`` is the per-token loss before aggregation (masked positions arbitrary; aggregation
applies the mask) and ``stats`` maps names to per-token detached tensors that the metric schema
reduces over valid tokens.
"""

from __future__ import annotations

import torch

from rlscope.methods.component import Component
from rlscope.methods.configs import ObjectiveConfig
from rlscope.methods.distill import DISTILL_OBJECTIVES
from rlscope.methods.objectives_2026 import OBJECTIVES_2026
from rlscope.methods.opd import OPD_OBJECTIVES
from rlscope.methods.terms import (
    LOG_RATIO_CLAMP,
    Objective,
    ObjectiveOut,
    PolicyTerms,
    clipped_surrogate,
    on_first_token,
    ratio,
    seq_log_ratio_B,
)
from rlscope.methods.tpo import TPO_OBJECTIVES


def score(x: PolicyTerms, cfg: ObjectiveConfig) -> ObjectiveOut:
    """REINFORCE score-function loss −ℓ_t · sg(w_t) (Williams 1992). Regime: on-policy."""
    return -x.logp_BT * x.weight_BT.detach(), {}


def is_capped(x: PolicyTerms, cfg: ObjectiveConfig) -> ObjectiveOut:
    """PG with a capped importance weight: −ℓ_t · sg(w_t · min(ρ_t, cap)).

    Off-policy capable (staleness, replay); on-policy it equals `score`. Logs ``iw_mean``.
    """
    iw_BT = ratio(x.logp_BT, x.logp_old_BT).detach().clamp_max(cfg.cap)
    return -x.logp_BT * (x.weight_BT * iw_BT).detach(), {"iw_mean": iw_BT}


def ppo_clip(x: PolicyTerms, cfg: ObjectiveConfig) -> ObjectiveOut:
    """PPO clipped surrogate, −min(ρA, clip(ρ, 1−ε_low, 1+ε_high)A), optional dual clip.

    Differentiates through ρ (Schulman et al. 1707.06347; clip-higher from DAPO 2503.14476;
    dual clip from Ye et al. 1912.09729). On-policy (ρ = 1) its gradient equals REINFORCE's.
    Clip fractions: ``low`` (ρ < 1−ε_low, A < 0), ``high`` (ρ > 1+ε_high, A > 0), ``region``
    (either), ``dual`` (the dual cap binds).
    """
    return clipped_surrogate(ratio(x.logp_BT, x.logp_old_BT), x.weight_BT.detach(), cfg)


def traj_is_capped(x: PolicyTerms, cfg: ObjectiveConfig) -> ObjectiveOut:
    """TrajPG: −ℓ_t · sg(w_t · min(ρ_seq, cap)), ρ_seq = exp Σ_t m_t (ℓ_t − ℓ_μ,t) broadcast.

    Trajectory-level importance sampling (the product of token ratios over valid tokens; the
    summed log-ratio is clamped to ±20 like `ratio`). Score form. On bandits (one token per
    sequence) it equals `is_capped`. Regime: off-policy capable; the product ratio's variance
    grows with length, hence the cap. Logs ``iw_mean``.
    """
    log_rho_B = seq_log_ratio_B(x).detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    iw_BT = torch.exp(log_rho_B).clamp_max(cfg.cap)[:, None].expand_as(x.logp_BT)
    return -x.logp_BT * (x.weight_BT * iw_BT).detach(), {"iw_mean": iw_BT}


def gspo(x: PolicyTerms, cfg: ObjectiveConfig) -> ObjectiveOut:
    """GSPO: `ppo_clip` with one ratio per sequence s_i = exp(mean_t m_t (ℓ_t − ℓ_μ,t)).

    Zheng et al. 2507.18071. s_i is differentiable, so every token's loss sends gradient
    A_t·s_i/|y_i| to every valid token of its sequence (|y_i| = Σ_t m_t). ε_low/ε_high come
    from the config (the preset uses METHODS.md's 3e-4 / 4e-4). Regime: sequence-level rewards;
    off-policy capable within the trust region. Same clip-fraction stats as `ppo_clip`.
    """
    mask_BT = x.mask_BT.to(x.logp_BT.dtype)
    n_B = mask_BT.sum(-1).clamp_min(1.0)
    log_s_B = (seq_log_ratio_B(x) / n_B).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    s_BT = torch.exp(log_s_B)[:, None].expand_as(x.logp_BT)
    return clipped_surrogate(s_BT, x.weight_BT.detach(), cfg)


def cispo(x: PolicyTerms, cfg: ObjectiveConfig) -> ObjectiveOut:
    """CISPO: −sg(min(ρ_t, ε_max)) · A_t · ℓ_t (MiniMax-M1, 2506.13585).

    The importance weight is capped and detached instead of clipping the surrogate, so no
    token's gradient is ever zeroed. Regime: off-policy capable. Logs ``cispo_capped_frac``
    (tokens with ρ > ε_max) and ``iw_mean`` (the capped weight).
    """
    rho_BT = ratio(x.logp_BT, x.logp_old_BT).detach()
    iw_BT = rho_BT.clamp_max(cfg.cispo_max)
    loss_BT = -x.logp_BT * (iw_BT * x.weight_BT).detach()
    return loss_BT, {"cispo_capped_frac": (rho_BT > cfg.cispo_max).float(), "iw_mean": iw_BT}


def aspo(x: PolicyTerms, cfg: ObjectiveConfig) -> ObjectiveOut:
    """ASPO asymmetric importance weight, score form −ℓ_t · sg(w_t · A_t).

    A > 0: w = min(μ/π, 1 + ε_high) = min(1/ρ, 1 + ε_high); A ≤ 0: w = max(ρ, 1 − ε_low).
    Flipping the ratio for positive tokens stops already-likely tokens from being pushed further.
    Regime: off-policy capable; reduces to REINFORCE on-policy (w = 1). Logs ``weight_mean`` (w)
    and ``pos_frac`` (tokens with A > 0), METHODS.md's names; its ``ratio_mean`` (ρ) is the
    ``policy/ratio_mean`` every method logs.
    """
    rho_BT = ratio(x.logp_BT, x.logp_old_BT).detach()
    adv_BT = x.weight_BT.detach()
    pos_BT = adv_BT > 0
    w_BT = torch.where(pos_BT, (1.0 / rho_BT).clamp_max(1.0 + cfg.clip_high),
                       rho_BT.clamp_min(1.0 - cfg.clip_low))
    loss_BT = -x.logp_BT * (w_BT * adv_BT).detach()
    return loss_BT, {"weight_mean": w_BT, "pos_frac": pos_BT.to(rho_BT.dtype)}


def r2vpo(x: PolicyTerms, cfg: ObjectiveConfig) -> ObjectiveOut:
    """R²VPO: loss_t = −(ρ_t A_t − λ(ρ_t − 1)²), differentiated through ρ, no cap.

    Derivation: METHODS.md fixes the effective weight ρ·(A − 2λ(ρ − 1)), i.e. the gradient
    −(A − 2λ(ρ − 1))·∇ρ (since ∇ρ = ρ∇ℓ). Integrating in ρ: ∫(A − 2λ(ρ − 1)) dρ = ρA − λ(ρ − 1)²,
    so the loss is its negative; d loss/dℓ = −ρ(A − 2λ(ρ − 1)). The penalty is a ratio-variance
    regulariser that vanishes on-policy (ρ = 1, gradient −A: REINFORCE). Regime: off-policy
    capable, moderate staleness (no cap). Logs ``var_penalty_mean`` = λ(ρ − 1)².
    """
    rho_BT = ratio(x.logp_BT, x.logp_old_BT)
    penalty_BT = cfg.r2vpo_lambda * (rho_BT - 1.0) ** 2
    loss_BT = -(rho_BT * x.weight_BT.detach() - penalty_BT)
    return loss_BT, {"var_penalty_mean": penalty_BT.detach()}


def sapo(x: PolicyTerms, cfg: ObjectiveConfig) -> ObjectiveOut:
    """SAPO soft trust region: −(4/τ) · σ(τ(ρ_t − 1)) · A_t, differentiated through ρ.

    τ = τ_pos for A > 0, τ_neg otherwise (the A = 0 loss is 0 either way). Qwen SAPO,
    2511.20347. The gate's slope at ρ = 1 is (4/τ)·τ/4 = 1, so on-policy its gradient is
    REINFORCE's; far from ρ = 1 the sigmoid flattens and damps the update smoothly.
    Regime: off-policy capable within a soft trust region.
    """
    adv_BT = x.weight_BT.detach()
    tau_pos_BT = torch.full_like(x.logp_BT, cfg.sapo_tau_pos).detach()
    tau_BT = torch.where(adv_BT > 0, tau_pos_BT, torch.full_like(tau_pos_BT, cfg.sapo_tau_neg))
    rho_BT = ratio(x.logp_BT, x.logp_old_BT)
    gate_BT = torch.sigmoid(tau_BT * (rho_BT - 1.0))
    return -(4.0 / tau_BT) * gate_BT * adv_BT, {"sapo_gate_mean": gate_BT.detach()}


def dro(x: PolicyTerms, cfg: ObjectiveConfig) -> ObjectiveOut:
    """DRO: −[ℓ_t A_t − (β/2)(ℓ_t − ℓ_μ,t)²] (Richemond et al., Direct Reward Optimisation).

    A quadratic proximal penalty on the log-ratio instead of clipping; its gradient β(ℓ − ℓ_μ)
    vanishes on-policy, where the objective is REINFORCE. Regime: off-policy capable.
    Logs ``dro_penalty_mean`` = (β/2)(ℓ − ℓ_μ)².
    """
    penalty_BT = 0.5 * cfg.dro_beta * (x.logp_BT - x.logp_old_BT) ** 2
    loss_BT = -(x.logp_BT * x.weight_BT.detach() - penalty_BT)
    return loss_BT, {"dro_penalty_mean": penalty_BT.detach()}


def log_growth(x: PolicyTerms, cfg: ObjectiveConfig) -> ObjectiveOut:
    """Log-growth PG: w_t = A_t · (1/π(a_t) if the sample succeeded else 1), score form.

    Successes are weighted by 1/π(a), so the update ascends log of the success probability
    rather than the success probability itself. Regime: binary-reward bandits only, no KL, no
    noise. Needs ``success_B`` (per-row flag, broadcast to tokens). Logs ``log_growth_weight``.
    """
    if x.success_B is None:
        raise ValueError("objective 'log_growth' needs PolicyTerms.success_B (per-row success "
                         "flag); the loop must fill it from the binary rewards")
    success_BT = x.success_B.to(torch.bool)[:, None].expand_as(x.logp_BT)
    inv_pi_BT = torch.exp(-x.logp_BT.detach())
    w_BT = x.weight_BT.detach() * torch.where(success_BT, inv_pi_BT, torch.ones_like(inv_pi_BT))
    return -x.logp_BT * w_BT, {"log_growth_weight": w_BT}


def pmd_mean(x: PolicyTerms, cfg: ObjectiveConfig) -> ObjectiveOut:
    """PMD-mean: per sequence (τ·Σ_t m_t (ℓ_t − ℓ_μ,t) − (r − E[r | x]))², a regression loss.

    Policy mirror descent: the optimum has τ·log(π/μ) = r − E[r | x]. The sequence loss sits on
    the sequence's **first valid token** (every other token's loss is 0), so `sum` gives
    Σ_i loss_i and `seq_mean_token_sum` gives mean_i loss_i (`token_mean` would divide by the
    token count instead). Rows with no valid token contribute nothing. Regime: off-policy
    capable. Needs ``rewards_B`` (r) and ``baseline_B`` (E[r | x] exact if exposed, else the
    batch mean reward). Logs ``pmd_seq_loss`` (the sequence loss broadcast to its tokens).
    """
    if x.rewards_B is None or x.baseline_B is None:
        raise ValueError("objective 'pmd_mean' needs PolicyTerms.rewards_B and "
                         "PolicyTerms.baseline_B (E[r | x], exact if exposed, else the batch "
                         "mean reward)")
    mask_BT = x.mask_BT.to(x.logp_BT.dtype)
    target_B = (x.rewards_B - x.baseline_B).to(x.logp_BT.dtype).detach()
    seq_loss_B = (cfg.pmd_tau * seq_log_ratio_B(x) - target_B) ** 2
    loss_BT = on_first_token(seq_loss_B, mask_BT)
    return loss_BT, {"pmd_seq_loss": seq_loss_B.detach()[:, None].expand_as(x.logp_BT)}


def ce_oracle(x: PolicyTerms, cfg: ObjectiveConfig) -> ObjectiveOut:
    """Cross-entropy on the ground-truth continuation (teacher-forced on the true prefix).

    A supervised upper bound, not like-for-like with RL: it ignores rewards and rollouts.
    """
    return -x.logp_BT, {}


_CLIP = ("clip_low", "clip_high", "dual_clip")
OBJECTIVES: dict[str, Objective] = {
    "score": Component(score),
    "is_capped": Component(is_capped, ("cap",)),
    "traj_is_capped": Component(traj_is_capped, ("cap",)),
    "ppo_clip": Component(ppo_clip, _CLIP),
    "gspo": Component(gspo, _CLIP),
    "cispo": Component(cispo, ("cispo_max",)),
    "aspo": Component(aspo, _CLIP[:2]),
    "r2vpo": Component(r2vpo, ("r2vpo_lambda",)),
    "sapo": Component(sapo, ("sapo_tau_pos", "sapo_tau_neg")),
    "dro": Component(dro, ("dro_beta",)),
    "log_growth": Component(log_growth),
    "pmd_mean": Component(pmd_mean, ("pmd_tau",), own_credit=True),
    "ce_oracle": Component(ce_oracle, own_credit=True, teacher_forced=True),
    **TPO_OBJECTIVES,
    **DISTILL_OBJECTIVES,
    **OBJECTIVES_2026,
    **OPD_OBJECTIVES,
}

__all__ = ["LOG_RATIO_CLAMP", "OBJECTIVES", "Objective", "ObjectiveOut", "PolicyTerms", "ratio"]
