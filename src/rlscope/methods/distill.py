"""DG plus a supervised term on the task's labels: ``self_distill`` and ``scope_lite``.

Both are the delight-gradient loss −ℓ_t·sg(w_t) (w = the gated advantage) plus α times a
cross-entropy of the learner's distribution at the **actor's** prefixes against the task's
label at that position (the policy is teacher-forced on its own rollout, not on the ground
truth, unlike ``ce_oracle``). They need sequence tasks with labels (validated).
"""

from __future__ import annotations

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


DISTILL_OBJECTIVES: dict[str, Objective] = {
    "self_distill": Component(self_distill, ("distill_alpha",), token_labels=True,
                              reads_distribution=True),
    "scope_lite": Component(scope_lite, ("distill_alpha",), token_labels=True,
                            reads_distribution=True),
}
"""The records of the label-distillation objectives (part of
`rlscope.methods.objectives.OBJECTIVES`)."""
