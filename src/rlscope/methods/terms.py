"""What every objective reads: `PolicyTerms`, the ratio ρ and the clipped surrogate.

Shared by `methods.objectives` (per-token rules), `methods.tpo` (soft group and candidate
targets) and `methods.distill` (DG plus a supervised term).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlscope.methods.component import Component
from rlscope.methods.configs import ObjectiveConfig
from rlscope.metrics.estimators import LOG_RATIO_CLAMP


@dataclass(frozen=True)
class PolicyTerms:
    """Inputs shared by all objectives.

    ``logp_BT``: current learner log-prob of each action token (differentiable).
    ``logp_old_BT``: behaviour log-prob ``ℓ_μ`` stored at sampling time.
    ``weight_BT``: the gated advantage ``w`` (detached). ``mask_BT``: loss mask.
    Optional, only for the objectives that need them (they raise ``ValueError`` when missing):

    - ``success_B``: per-row success flag (``log_growth``); ``rewards_B``: scalar sequence
      reward r and ``baseline_B``: E[r | x] (exact if exposed, else the batch mean reward)
      (``pmd_mean``, the TPO family).
    - ``logp_BTV``: the learner's processed log-probs over the vocabulary (differentiable):
      ``tpo_full_action``, the candidate objectives, the distillation terms.
    - ``group_size``: rows per group; the rows are whole contiguous groups (TPO family).
    - ``candidates_BTK``, ``cand_logp_old_BTK``, ``cand_rewards_BTK``: the `CandidateBatch`
      of ``tpo_token`` / ``grpo_token``.
    - ``tokens_BT`` (the generated tokens), ``targets_BT`` (the task's labels) and
      ``label_mask_BT`` (scored positions): ``self_distill`` and ``scope_lite``.
    - ``gate_BT``: the gate's factor g (detached), where the gate has one.
    - ``select_BT``: the objective's batch-statistic token selection (1.0 = selected),
      chosen over the whole optimizer minibatch (`rlscope.methods.batch_stats`).
    - ``teacher_logp_BTV``: a teacher's log-probs over the vocabulary at each position
      (detached; ``gkd_jsd``, the OPD objectives).
    - ``step``: the run's step of this update (``opd_topk_reverse_kl``'s warm-up switch).
    """

    logp_BT: torch.Tensor
    logp_old_BT: torch.Tensor
    weight_BT: torch.Tensor
    mask_BT: torch.Tensor
    success_B: torch.Tensor | None = None
    rewards_B: torch.Tensor | None = None
    baseline_B: torch.Tensor | None = None
    logp_BTV: torch.Tensor | None = None
    group_size: int = 1
    candidates_BTK: torch.Tensor | None = None
    cand_logp_old_BTK: torch.Tensor | None = None
    cand_rewards_BTK: torch.Tensor | None = None
    tokens_BT: torch.Tensor | None = None
    targets_BT: torch.Tensor | None = None
    label_mask_BT: torch.Tensor | None = None
    gate_BT: torch.Tensor | None = None
    select_BT: torch.Tensor | None = None
    teacher_logp_BTV: torch.Tensor | None = None
    step: torch.Tensor | None = None
    """The optimizer step of the update, a 0-d tensor (objectives that switch with it)."""


ObjectiveOut = tuple[torch.Tensor, dict[str, torch.Tensor]]
Objective = Component[[PolicyTerms, ObjectiveConfig], ObjectiveOut]
"""A registered objective (`rlscope.methods.objectives.OBJECTIVES`)."""


def require(value: torch.Tensor | None, field: str, objective: str) -> torch.Tensor:
    """``value``, or a ValueError naming the `PolicyTerms` field the objective needs."""
    if value is None:
        raise ValueError(f"objective {objective!r} needs PolicyTerms.{field}")
    return value


def ratio(logp_BT: torch.Tensor, logp_old_BT: torch.Tensor) -> torch.Tensor:
    """ρ = exp(clamp(ℓ − ℓ_μ, −20, 20))."""
    return torch.exp((logp_BT - logp_old_BT).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def seq_log_ratio_B(x: PolicyTerms) -> torch.Tensor:
    """Σ_t m_t (ℓ_t − ℓ_μ,t) per sequence, shape [B] (differentiable through ℓ)."""
    return ((x.logp_BT - x.logp_old_BT) * x.mask_BT.to(x.logp_BT.dtype)).sum(-1)


def on_first_token(value_B: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """A per-sequence loss placed on each sequence's first valid token, zero elsewhere.

    Under ``seq_mean_token_sum`` the aggregate is then mean_i value_i, and under ``sum``
    Σ_i value_i. Rows without a valid token contribute nothing.
    """
    first_BT = (mask_BT > 0) & (mask_BT.cumsum(-1) == mask_BT)
    return torch.where(first_BT, value_B[:, None], torch.zeros_like(mask_BT, dtype=value_B.dtype))


def clipped_surrogate(rho_BT: torch.Tensor, adv_BT: torch.Tensor, cfg: ObjectiveConfig
                       ) -> ObjectiveOut:
    """−min(ρA, clip(ρ, 1−ε_low, 1+ε_high)A) with optional dual clip, and its clip flags."""
    unclipped_BT = rho_BT * adv_BT
    clipped_BT = rho_BT.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high) * adv_BT
    loss_BT = -torch.minimum(unclipped_BT, clipped_BT)
    rho_d = rho_BT.detach()
    low_BT = ((rho_d < 1.0 - cfg.clip_low) & (adv_BT < 0)).float()
    high_BT = ((rho_d > 1.0 + cfg.clip_high) & (adv_BT > 0)).float()
    stats = {"clipfrac_low": low_BT, "clipfrac_high": high_BT,
             "clipfrac_region": torch.maximum(low_BT, high_BT)}
    if cfg.dual_clip > 0:
        cap_BT = -cfg.dual_clip * adv_BT
        dual_BT = (adv_BT < 0) & (loss_BT.detach() > cap_BT)
        loss_BT = torch.where(adv_BT < 0, torch.minimum(loss_BT, cap_BT), loss_BT)
        stats["clipfrac_dual"] = dual_BT.float()
    return loss_BT, stats


