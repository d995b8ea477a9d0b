"""DG plus a supervised term on the task's labels: ``self_distill`` and ``scope_lite``; and
``gkd_jsd``, the generalised JSD to a teacher's distribution on the student's samples (GKD).

Both are the delight-gradient loss −ℓ_t·sg(w_t) (w = the gated advantage) plus α times a
cross-entropy of the learner's distribution at the **actor's** prefixes against the task's
label at that position (the policy is teacher-forced on its own rollout, not on the ground
truth, unlike ``ce_oracle``). They need sequence tasks with labels (validated).
"""

from __future__ import annotations

import math

import torch

from rlscope.methods.component import Component
from rlscope.methods.configs import ObjectiveConfig
from rlscope.methods.terms import Objective, ObjectiveOut, PolicyTerms, require


def _label_ce(x: PolicyTerms, objective: str) -> tuple[torch.Tensor, torch.Tensor]:
    """CE_t = −log π(y_t | actor prefix) at every position, and the scored-position mask."""
    logp_BTV = require(x.logp_BTV, "logp_BTV", objective)
    targets_BT = require(x.targets_BT, "targets_BT", objective)
    scored_BT = x.label_mask_BT if x.label_mask_BT is not None else x.mask_BT
    ce_BT = -logp_BTV.gather(-1, targets_BT[..., None]).squeeze(-1)
    return ce_BT, scored_BT.to(ce_BT.dtype) * x.mask_BT.to(ce_BT.dtype)


def self_distill(x: PolicyTerms, cfg: ObjectiveConfig) -> ObjectiveOut:
    """SelfDistillDG: DG loss + α·mean_t(sg(g_t)·CE_t).

    The advantage is the token oracle A_t = (1[a_t = y_t] − Σ_v π(v)²)·m_t (estimator
    ``oracle_token``), g_t the delight gate σ(A_t·(−ℓ_t)/η), CE_t the label cross-entropy at the
    actor's prefix on **every** valid position, scored or not (METHODS.md has no score mask on
    the CE term, nor has the reference: at an unscored position A_t = 0, so g_t = σ(0) = 1/2 and
    the label is distilled at half weight); α = ``distill_alpha`` (0.5). With ``token_mean`` the
    mean runs over the same tokens as the DG loss. Source: the delight-gradient sandbox.
    Regime: sequence tasks with per-token labels. Logs ``distill_ce`` (the gated CE).
    """
    gate_BT = require(x.gate_BT, "gate_BT", "self_distill").detach()
    ce_BT, _ = _label_ce(x, "self_distill")
    distill_BT = gate_BT * ce_BT * x.mask_BT.to(ce_BT.dtype)
    loss_BT = -x.logp_BT * x.weight_BT.detach() + cfg.distill_alpha * distill_BT
    return loss_BT, {"distill_ce": distill_BT.detach()}


def scope_lite(x: PolicyTerms, cfg: ObjectiveConfig) -> ObjectiveOut:
    """SCOPELite: DG loss + α × the label cross-entropy from the first wrong token on.

    The correction suffix of a rollout starts at its first position (scored or not) whose token
    differs from the label and runs to the end, and is then intersected with the scored
    positions (METHODS.md and the reference: an error in masked_reversal's unscored prefix
    opens the whole scored suffix to correction); rollouts with no wrong token have none.
    α = ``distill_alpha`` (0.5). Departure from METHODS.md's "mean over the suffix": the suffix
    CE is summed per token and aggregated with the DG loss's own denominator (all valid tokens
    under ``token_mean``), so gradient accumulation stays exact and α is relative to the
    per-token DG loss (docs/architecture.md); the correction is the reference's times the
    batch's suffix fraction (docs/reference_check.md).
    Source: the delight-gradient sandbox. Regime: sequence tasks
    with per-token labels. Logs ``first_error_frac`` (valid tokens inside a correction suffix)
    and ``correction_loss`` (their CE, over all valid tokens).
    """
    tokens_BT = require(x.tokens_BT, "tokens_BT", "scope_lite")
    targets_BT = require(x.targets_BT, "targets_BT", "scope_lite")
    ce_BT, scored_BT = _label_ce(x, "scope_lite")
    valid_BT = x.mask_BT.to(ce_BT.dtype)
    wrong_BT = (tokens_BT != targets_BT).to(ce_BT.dtype) * valid_BT
    suffix_BT = (wrong_BT.cumsum(-1) > 0).to(ce_BT.dtype) * scored_BT
    correction_BT = ce_BT * suffix_BT
    loss_BT = -x.logp_BT * x.weight_BT.detach() + cfg.distill_alpha * correction_BT
    return loss_BT, {"first_error_frac": suffix_BT, "correction_loss": correction_BT.detach()}


def _kl_BT(logp_BTV: torch.Tensor, logq_BTV: torch.Tensor) -> torch.Tensor:
    """KL(p‖q) = Σ_v p(v)(log p(v) − log q(v)) per position; terms with p(v) = 0 are 0."""
    p_BTV = logp_BTV.exp()
    return (p_BTV * (logp_BTV - logq_BTV).masked_fill(p_BTV == 0, 0.0)).sum(-1)


def generalized_jsd_BT(student_BTV: torch.Tensor, teacher_BTV: torch.Tensor,
                       beta: float) -> torch.Tensor:
    """JSD_β(P_T ‖ P_θ) per position from log-probs ``[B, T, V]``: with M = β P_T + (1 − β) P_θ,
    β KL(P_T‖M) + (1 − β) KL(P_θ‖M); β = 0 is KL(P_T‖P_θ) and β = 1 is KL(P_θ‖P_T), the
    limits special-cased as TRL's ``generalized_jsd_loss`` (the formula itself gives 0 there).
    M is formed in log space (logsumexp)."""
    if beta == 0:
        return _kl_BT(teacher_BTV, student_BTV)
    if beta == 1:
        return _kl_BT(student_BTV, teacher_BTV)
    log_m_BTV = torch.logsumexp(torch.stack([teacher_BTV + math.log(beta),
                                             student_BTV + math.log(1 - beta)]), 0)
    return beta * _kl_BT(teacher_BTV, log_m_BTV) + (1 - beta) * _kl_BT(student_BTV, log_m_BTV)


def gkd_jsd(x: PolicyTerms, cfg: ObjectiveConfig) -> ObjectiveOut:
    """GKD: ℓoss_t = JSD_β(P_T ‖ P_θ) at each student prefix s_t over the full vocabulary,
    both distributions at temperature τ (`generalized_jsd_BT`); the gradient flows through
    P_θ only (the teacher is detached). No advantage or reward enters.

    β = ``gkd_beta`` (0.5), τ = ``gkd_temperature`` (1; applied to the learner's processed
    log-probs, so relative to the sampling temperature), λ = ``gkd_lambda`` (1: student
    samples only; λ < 1 would mix in labelled sequences and is rejected, METHODS_2026.md §5).
    Source: Agarwal et al. 2306.13649; TRL ``GKDTrainer``. Regime: a teacher with the
    student's vocabulary giving its full distribution (top-k teachers rejected). Logs
    ``distill/jsd``, ``distill/rkl`` = KL(P_θ‖P_T) and ``distill/fkl`` = KL(P_T‖P_θ).
    """
    logp_BTV = require(x.logp_BTV, "logp_BTV", "gkd_jsd")
    teacher_BTV = require(x.teacher_logp_BTV, "teacher_logp_BTV", "gkd_jsd").detach()
    student_BTV = (logp_BTV / cfg.gkd_temperature).log_softmax(-1)
    teacher_BTV = (teacher_BTV / cfg.gkd_temperature).log_softmax(-1)
    m_BT = x.mask_BT.to(student_BTV.dtype)
    jsd_BT = generalized_jsd_BT(student_BTV, teacher_BTV, cfg.gkd_beta)
    s_d_BTV = student_BTV.detach()
    return jsd_BT * m_BT, {"distill/jsd": jsd_BT.detach(),
                           "distill/rkl": _kl_BT(s_d_BTV, teacher_BTV),
                           "distill/fkl": _kl_BT(teacher_BTV, s_d_BTV)}


DISTILL_OBJECTIVES: dict[str, Objective] = {
    "self_distill": Component(self_distill, ("distill_alpha",), token_labels=True,
                              reads_distribution=True),
    "scope_lite": Component(scope_lite, ("distill_alpha",), token_labels=True,
                            reads_distribution=True),
    "gkd_jsd": Component(gkd_jsd, ("gkd_beta", "gkd_temperature", "gkd_lambda"),
                         reads_distribution=True, needs_teacher_distribution=True),
}
"""The records of the label-distillation objectives (part of
`rlscope.methods.objectives.OBJECTIVES`)."""
