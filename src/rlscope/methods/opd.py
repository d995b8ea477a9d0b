"""On-policy distillation from a built-in teacher (COMPANIONS.md §1): the exact
full-vocabulary reverse KL ``opd_reverse_kl``, its top-k truncation ``opd_topk_reverse_kl``
with a ``student`` / ``teacher`` / ``intersection`` support and a warm-up switch, and the
evaluation diagnostics every OPD preset logs (`opd_diagnostics`).

Objectives follow `rlscope.methods.objectives`: ``(PolicyTerms, ObjectiveConfig) -> (loss_BT,
stats)``; the per-token loss is aggregated by the preset's ``token_mean``. Top-k sets break
ties toward the lower id (a stable descending sort), and the truncated loss is **not**
renormalised: the teacher mass outside the support stays visible.
"""

from __future__ import annotations

import torch

from rlscope.methods.component import Component
from rlscope.methods.configs import ObjectiveConfig
from rlscope.methods.terms import Objective, ObjectiveOut, PolicyTerms, require

SUPPORTS = ("student", "teacher", "intersection")
"""The top-k supports S_t of ``opd_topk_reverse_kl`` (``--opd_support``)."""


def topk_mask_BTV(x_BTV: torch.Tensor, k: int) -> torch.Tensor:
    """1.0 on the k largest entries of each row of ``x_BTV`` (ties to the lower id), else 0."""
    order_BTV = torch.sort(x_BTV.detach(), dim=-1, descending=True, stable=True).indices
    mask_BTV = torch.zeros_like(x_BTV, dtype=torch.float32)
    return mask_BTV.scatter(-1, order_BTV[..., :k], 1.0).to(x_BTV.dtype)


def support_mask_BTV(student_BTV: torch.Tensor, teacher_BTV: torch.Tensor, k: int,
                     support: str) -> torch.Tensor:
    """S_t as a 0/1 mask ``[B, T, V]``: the top-k of the student (chosen under no-grad), of the
    teacher, or both (the intersection, which may be empty)."""
    if support not in SUPPORTS:
        raise ValueError(f"method.opd_support={support!r} is unknown; valid: "
                         f"{', '.join(SUPPORTS)}")
    student_mask = topk_mask_BTV(student_BTV.detach(), k)
    if support == "student":
        return student_mask
    teacher_mask = topk_mask_BTV(teacher_BTV, k)
    return teacher_mask if support == "teacher" else student_mask * teacher_mask


def reverse_kl_terms_BTV(student_BTV: torch.Tensor, teacher_BTV: torch.Tensor) -> torch.Tensor:
    """π(a)(log π(a) − log π_T(a)) per action, from log-probs ``[B, T, V]`` (differentiable
    through the student; 0 where π(a) = 0)."""
    p_BTV = student_BTV.exp()
    return p_BTV * (student_BTV - teacher_BTV).masked_fill(p_BTV == 0, 0.0)


def _support_stats(student_BTV: torch.Tensor, teacher_BTV: torch.Tensor,
                   mask_BTV: torch.Tensor) -> dict[str, torch.Tensor]:
    """``opd/`` support statistics per token: Σ_S π, Σ_S π_T, |S|, [argmax π = argmax π_T]."""
    s_BTV = student_BTV.detach()
    return {"opd/student_topk_mass": (s_BTV.exp() * mask_BTV).sum(-1),
            "opd/teacher_topk_mass": (teacher_BTV.exp() * mask_BTV).sum(-1),
            "opd/topk_support_size": mask_BTV.sum(-1),
            "opd/top1_agreement": (s_BTV.argmax(-1) == teacher_BTV.argmax(-1)).to(s_BTV.dtype)}


def opd_reverse_kl(x: PolicyTerms, cfg: ObjectiveConfig) -> ObjectiveOut:
    """OPDReverseKL: KL_t = Σ_a π(a|s_t)(log π(a|s_t) − log π_T(a|s_t)), exact over the whole
    vocabulary at every visited student prefix, the gradient through π (the teacher is fixed).

    No advantage or reward enters (the task reward is only logged). Source: COMPANIONS.md §1
    (rl-experiments ``opd_sandbox``). Regime: a built-in teacher over the task's targets
    (``--teacher``), on-policy."""
    student_BTV = require(x.logp_BTV, "logp_BTV", "opd_reverse_kl")
    teacher_BTV = require(x.teacher_logp_BTV, "teacher_logp_BTV", "opd_reverse_kl").detach()
    kl_BT = reverse_kl_terms_BTV(student_BTV, teacher_BTV).sum(-1)
    return kl_BT * x.mask_BT.to(kl_BT.dtype), {"opd/reverse_kl": kl_BT.detach()}


def opd_topk_reverse_kl(x: PolicyTerms, cfg: ObjectiveConfig) -> ObjectiveOut:
    """OPDTopKReverseKL: Σ_{a∈S_t} π(a)(log π(a) − log π_T(a)), **not renormalised**, with S_t
    the top-k (k = ``opd_top_k``) of the student, of the teacher or of both
    (``opd_support``); ties to the lower id.

    With ``opd_warmup_steps`` W > 0 the steps before W use `opd_reverse_kl`'s exact loss (the
    warm-up switch). With k = the vocabulary size and the student or teacher support it equals
    `opd_reverse_kl`. Logs ``opd/student_topk_mass`` Σ_S π, ``opd/teacher_topk_mass`` Σ_S π_T,
    ``opd/topk_support_size`` |S| and ``opd/top1_agreement``. Source: COMPANIONS.md §1.
    Regime: a built-in teacher, on-policy; 1 ≤ k ≤ vocabulary size."""
    student_BTV = require(x.logp_BTV, "logp_BTV", "opd_topk_reverse_kl")
    teacher_BTV = require(x.teacher_logp_BTV, "teacher_logp_BTV",
                          "opd_topk_reverse_kl").detach()
    terms_BTV = reverse_kl_terms_BTV(student_BTV, teacher_BTV)
    mask_BTV = support_mask_BTV(student_BTV, teacher_BTV, cfg.opd_top_k, cfg.opd_support)
    topk_BT = (terms_BTV * mask_BTV).sum(-1)
    if cfg.opd_warmup_steps > 0 and int(require(x.step, "step", "opd_topk_reverse_kl")) \
            < cfg.opd_warmup_steps:  # the warm-up: the exact loss (the stats stay top-k's)
        topk_BT = terms_BTV.sum(-1)
    m_BT = x.mask_BT.to(topk_BT.dtype)
    return topk_BT * m_BT, _support_stats(student_BTV, teacher_BTV, mask_BTV)


OPD_OBJECTIVES: dict[str, Objective] = {
    "opd_reverse_kl": Component(opd_reverse_kl, reads_distribution=True,
                                needs_teacher_distribution=True, builtin_teacher=True),
    "opd_topk_reverse_kl": Component(
        opd_topk_reverse_kl, ("opd_top_k", "opd_support", "opd_warmup_steps"),
        reads_distribution=True, needs_teacher_distribution=True, builtin_teacher=True,
        reads_step=True),
}
"""The records of the OPD objectives (part of `rlscope.methods.objectives.OBJECTIVES`)."""


def _entropy_BT(logp_BTV: torch.Tensor) -> torch.Tensor:
    return -(logp_BTV.exp() * logp_BTV).sum(-1)


def opd_diagnostics(student_BTV: torch.Tensor, teacher_BTV: torch.Tensor,
                    tokens_BT: torch.Tensor, mask_BT: torch.Tensor, overlap_k: int,
                    support_k: int, support: str) -> dict[str, torch.Tensor]:
    """The OPD evaluation diagnostics (COMPANIONS.md §1, "Diagnostics") of student samples
    ``tokens_BT`` with the student's and the teacher's log-probs ``[B, T, V]`` at their
    prefixes, as token means over ``mask_BT``: ``eval/opd_reverse_kl`` KL(π‖π_T),
    ``eval/opd_forward_kl`` KL(π_T‖π), ``eval/opd_sampled_reverse_kl`` mean(ℓ(a_t) − log
    π_T(a_t)), student and teacher entropies and their gap, ``eval/top1_agreement``,
    ``eval/overlap_at_k`` |top-k(π) ∩ top-k(π_T)|/k (k = ``overlap_k``), and the support
    masses ``eval/student_topk_mass``, ``eval/teacher_topk_mass`` and
    ``eval/topk_support_size`` of the support (``support_k``, ``support``)."""
    m_BT = mask_BT.to(student_BTV.dtype)
    n = m_BT.sum().clamp_min(1.0)

    def mean(x_BT: torch.Tensor) -> torch.Tensor:
        return (x_BT * m_BT).sum() / n

    rkl_BT = reverse_kl_terms_BTV(student_BTV, teacher_BTV).sum(-1)
    fkl_BT = reverse_kl_terms_BTV(teacher_BTV, student_BTV).sum(-1)
    sampled_BT = (student_BTV.gather(-1, tokens_BT[..., None])
                  - teacher_BTV.gather(-1, tokens_BT[..., None])).squeeze(-1)
    h_s_BT, h_t_BT = _entropy_BT(student_BTV), _entropy_BT(teacher_BTV)
    overlap_BT = (topk_mask_BTV(student_BTV, overlap_k)
                  * topk_mask_BTV(teacher_BTV, overlap_k)).sum(-1) / overlap_k
    support_BTV = support_mask_BTV(student_BTV, teacher_BTV, support_k, support)
    out = {"eval/opd_reverse_kl": mean(rkl_BT), "eval/opd_forward_kl": mean(fkl_BT),
           "eval/opd_sampled_reverse_kl": mean(sampled_BT),
           "eval/student_entropy": mean(h_s_BT), "eval/teacher_entropy": mean(h_t_BT),
           "eval/entropy_gap": mean(h_s_BT - h_t_BT), "eval/overlap_at_k": mean(overlap_BT)}
    for name, x_BT in _support_stats(student_BTV, teacher_BTV, support_BTV).items():
        out[f"eval/{name.removeprefix('opd/')}"] = mean(x_BT)
    return out
