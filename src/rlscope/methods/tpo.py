"""The TPO family: soft targets over a group of samples or a set of next-token candidates.

TPO (target policy optimisation) does not weight log-probs by advantages; it builds a target
distribution q over the samples of a group — the behaviour policy's distribution over them,
tilted by each sample's skill (its reward's z-score) — and fits the policy to q by
cross-entropy. Variants (METHODS.md, "Objectives"):

- ``tpo``: q = softmax(log_softmax(s^old) + skill/η) over a group's summed sequence log-probs.
- ``tpo_no_anchor``: q = softmax(skill/η) (no behaviour anchor).
- ``group_pg``: −Σ_i (skill_i/η)·log π(y_i), TPO's weights without its soft target.
- ``tpo_full_action``: a one-action (bandit) form over every class of the vocabulary.
- ``tpo_token`` / ``grpo_token``: per generated prefix, over K next-token candidates from a
  `CandidateBatch`.

The group objectives put each sequence's share of its group's loss on the sequence's first
valid token and expect ``seq_mean_token_sum`` aggregation, so the aggregate is the mean over
groups (see `group_loss_B`); the candidate and full-action objectives are per token and expect
``token_mean`` (the mean over prefixes); their records (`TPO_OBJECTIVES`) declare it and
`rlscope.methods.validate_method` enforces it.
"""

from __future__ import annotations

import dataclasses

import torch

from rlscope.methods.component import Component
from rlscope.methods.configs import ObjectiveConfig
from rlscope.methods.terms import (
    Objective,
    ObjectiveOut,
    PolicyTerms,
    clipped_surrogate,
    on_first_token,
    ratio,
    require,
)

SKILL_STD_MIN = 1e-6
"""Skills are z-scores; below this reward std they are only centred (METHODS.md)."""

def skill(rewards_NK: torch.Tensor) -> torch.Tensor:
    """Z-score of rewards along the last axis (population std); only centred when the std is
    ≤ 1e-6, so a uniform set has skill 0 everywhere."""
    centred_NK = rewards_NK - rewards_NK.mean(-1, keepdim=True)
    std_N1 = rewards_NK.std(-1, unbiased=False, keepdim=True)
    return torch.where(std_N1 > SKILL_STD_MIN, centred_NK / std_N1.clamp_min(SKILL_STD_MIN),
                       centred_NK)


def soft_target(anchor_NK: torch.Tensor | None, skill_NK: torch.Tensor, eta: float
                ) -> torch.Tensor:
    """q = softmax(anchor + skill/η) (detached); no anchor means a uniform one."""
    logits_NK = skill_NK / eta
    if anchor_NK is not None:
        logits_NK = logits_NK + anchor_NK
    return logits_NK.detach().softmax(-1)


def cross_entropy(q_NK: torch.Tensor, logp_NK: torch.Tensor) -> torch.Tensor:
    """−Σ_k q_k · logp_k, with 0 · (−inf) taken as 0 (classes outside a top-k/top-p set)."""
    terms_NK = torch.where(q_NK > 0, q_NK * logp_NK, torch.zeros_like(logp_NK))
    return -terms_NK.sum(-1)


def target_stats(q_NK: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Entropy and top probability of the target, each shaped like ``q_NK[..., 0]``."""
    plogp_NK = torch.where(q_NK > 0, q_NK * q_NK.clamp_min(1e-30).log(), torch.zeros_like(q_NK))
    return -plogp_NK.sum(-1), q_NK.max(-1).values


def _groups(x: PolicyTerms, objective: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Current and behaviour summed sequence log-probs and the skill, each ``[groups, G]``."""
    rewards_B = require(x.rewards_B, "rewards_B", objective)
    G = x.group_size
    if G < 2 or x.logp_BT.shape[0] % G:
        raise ValueError(f"objective {objective!r} needs whole groups of group_size > 1 rows; "
                         f"got {x.logp_BT.shape[0]} rows with group_size={G}")
    mask_BT = x.mask_BT.to(x.logp_BT.dtype)
    s_GK = (x.logp_BT * mask_BT).sum(-1).view(-1, G)
    s_old_GK = (x.logp_old_BT * mask_BT).sum(-1).view(-1, G)
    return s_GK, s_old_GK, skill(rewards_B.to(x.logp_BT.dtype).view(-1, G))


def _per_token(value_GK: torch.Tensor, like_BT: torch.Tensor) -> torch.Tensor:
    """A per-sample value (laid out ``[groups, G]``) broadcast to every token of the sample."""
    return value_GK.reshape(-1)[:, None].expand_as(like_BT).detach()


def _soft_group_target(x: PolicyTerms, cfg: ObjectiveConfig, anchored: bool,
                       objective: str) -> ObjectiveOut:
    s_GK, s_old_GK, skill_GK = _groups(x, objective)
    anchor_GK = s_old_GK.log_softmax(-1) if anchored else None
    q_GK = soft_target(anchor_GK, skill_GK, cfg.tpo_eta)
    G = x.group_size
    # Each sample's share of its group's loss, × G: seq_mean_token_sum over N = groups × G
    # rows then gives the mean over groups of −Σ_i q_i log_softmax(s)_i.
    share_GK = -G * q_GK * s_GK.log_softmax(-1)
    entropy_G, top_G = target_stats(q_GK)
    return on_first_token(share_GK.reshape(-1), x.mask_BT), {
        "tpo_target_entropy": _per_token(entropy_G[:, None].expand_as(q_GK), x.logp_BT),
        "tpo_target_top_prob": _per_token(top_G[:, None].expand_as(q_GK), x.logp_BT)}


def tpo(x: PolicyTerms, cfg: ObjectiveConfig) -> ObjectiveOut:
    """TPO: per group of G samples with summed log-probs s (current) and s^old (behaviour),
    q = softmax(log_softmax(s^old) + skill/η) (detached) and loss −Σ_i q_i log_softmax(s)_i,
    averaged over groups.

    skill = the group z-score of rewards (centred only when the std ≤ 1e-6), η = ``tpo_eta``.
    With a uniform skill the target is the behaviour's own group distribution, so the first
    on-policy gradient is zero. Source: Target Policy Optimisation (the TPO sandbox).
    Regime: grouped sampling (G > 1); rows are whole contiguous groups; aggregation
    ``seq_mean_token_sum``. Logs ``tpo_target_entropy`` and ``tpo_target_top_prob``.
    """
    return _soft_group_target(x, cfg, anchored=True, objective="tpo")


def tpo_no_anchor(x: PolicyTerms, cfg: ObjectiveConfig) -> ObjectiveOut:
    """TPO without the behaviour anchor: q = softmax(skill/η) (METHODS.md ``tpo_no_anchor``).

    The ablation that shows what the anchor does: the target no longer depends on the policy,
    so every step pulls the group towards the same reward-only distribution. Regime as `tpo`.
    """
    return _soft_group_target(x, cfg, anchored=False, objective="tpo_no_anchor")


def group_pg(x: PolicyTerms, cfg: ObjectiveConfig) -> ObjectiveOut:
    """Per group −Σ_i (skill_i/η)·log π(y_i), averaged over groups: TPO's weights without its
    soft target (a policy gradient with z-scored group rewards and no ratio).

    Written per token, −G·(skill_i/η)·ℓ_t, so ``seq_mean_token_sum`` gives the mean over groups
    of the group sums. Regime as `tpo`.
    """
    _, _, skill_GK = _groups(x, "group_pg")
    weight_BT = _per_token(skill_GK / cfg.tpo_eta, x.logp_BT)
    return -x.group_size * weight_BT * x.logp_BT, {}


def tpo_full_action(x: PolicyTerms, cfg: ObjectiveConfig) -> ObjectiveOut:
    """TPO over every action of a one-step (bandit) task.

    The sampled class a gets A = r − Σ_v π(v)² (π the current learner's distribution,
    detached; on-policy it is the behaviour's); the score vector over the V classes is A at a
    and 0 elsewhere, skill its z-score across classes; q = softmax(sg(log π) + skill/η); the
    loss is CE(q, π) = −Σ_v q_v log π_v. Regime: bandit tasks, on-policy, one inner epoch,
    clean rewards (validated). Logs ``tpo_target_entropy`` and ``tpo_target_top_prob``.
    """
    logp_BTV = require(x.logp_BTV, "logp_BTV", "tpo_full_action")
    rewards_B = require(x.rewards_B, "rewards_B", "tpo_full_action")
    logp_d_BTV = logp_BTV.detach()
    adv_BT = rewards_B.to(logp_BTV.dtype)[:, None] - logp_d_BTV.exp().square().sum(-1)
    tokens_BT = require(x.tokens_BT, "tokens_BT", "tpo_full_action")
    score_BTV = torch.zeros_like(logp_d_BTV).scatter(-1, tokens_BT[..., None], adv_BT[..., None])
    q_BTV = soft_target(logp_d_BTV, skill(score_BTV), cfg.tpo_eta)
    entropy_BT, top_BT = target_stats(q_BTV)
    return cross_entropy(q_BTV, logp_BTV), {"tpo_target_entropy": entropy_BT,
                                             "tpo_target_top_prob": top_BT}


def _candidates(x: PolicyTerms, objective: str
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Current log-probs, behaviour log-probs and rewards of the candidates, ``[B, T, K]``."""
    logp_BTV = require(x.logp_BTV, "logp_BTV", objective)
    cand_BTK = require(x.candidates_BTK, "candidates_BTK", objective)
    old_BTK = require(x.cand_logp_old_BTK, "cand_logp_old_BTK", objective)
    rewards_BTK = require(x.cand_rewards_BTK, "cand_rewards_BTK", objective)
    return logp_BTV.gather(-1, cand_BTK), old_BTK, rewards_BTK.to(logp_BTV.dtype)


def tpo_token(x: PolicyTerms, cfg: ObjectiveConfig) -> ObjectiveOut:
    """TPO per generated prefix over K next-token candidates (a `CandidateBatch`).

    skill = z-score of the candidates' dense rewards; q = softmax(log_softmax(old candidate
    log-probs) + skill/η); loss_t = −Σ_k q_k · log_softmax(current candidate log-probs)_k,
    averaged over prefixes (``token_mean``). Candidates are drawn with replacement, so a token
    drawn twice appears twice in both distributions. Regime: token tasks with clean,
    decomposable rewards, K = group_size > 1, on-policy (validated). Logs
    ``tpo_target_entropy`` and ``tpo_target_top_prob``.
    """
    cur_BTK, old_BTK, rewards_BTK = _candidates(x, "tpo_token")
    q_BTK = soft_target(old_BTK.log_softmax(-1), skill(rewards_BTK), cfg.tpo_eta)
    entropy_BT, top_BT = target_stats(q_BTK)
    return cross_entropy(q_BTK, cur_BTK.log_softmax(-1)), {"tpo_target_entropy": entropy_BT,
                                                             "tpo_target_top_prob": top_BT}


def grpo_token(x: PolicyTerms, cfg: ObjectiveConfig) -> ObjectiveOut:
    """GRPO per generated prefix over K next-token candidates (a `CandidateBatch`).

    A_k = (r_k − mean_K r) / (std_K r + 1e-8); ρ_k = exp(ℓ_k − ℓ_k^old) per candidate; the PPO
    clipped surrogate (ε from the config, 0.2 in the preset) plus β·k3(ℓ_k, ℓ_k^old)
    (β = ``candidate_kl``, 0.04), summed over candidates and averaged over prefixes
    (``token_mean``). The GRPO counterpart of `tpo_token` on the same candidates. Logs the clip
    fractions (mean over candidates) and ``candidate_kl`` (Σ_k k3).
    """
    cur_BTK, old_BTK, rewards_BTK = _candidates(x, "grpo_token")
    centred_BTK = rewards_BTK - rewards_BTK.mean(-1, keepdim=True)
    adv_BTK = centred_BTK / (rewards_BTK.std(-1, unbiased=False, keepdim=True) + 1e-8)
    surrogate_BTK, clip_stats = clipped_surrogate(ratio(cur_BTK, old_BTK), adv_BTK, cfg)
    d_BTK = cur_BTK - old_BTK
    k3_BTK = torch.expm1(-d_BTK) + d_BTK
    loss_BT = (surrogate_BTK + cfg.candidate_kl * k3_BTK).sum(-1)
    stats = {name: v.mean(-1) for name, v in clip_stats.items()}
    return loss_BT, stats | {"candidate_kl": k3_BTK.detach().sum(-1)}


_GROUP = Component(tpo, ("tpo_eta",), grouped=True, whole_groups=True,
                   own_aggregation="seq_mean_token_sum", own_credit=True)
_CANDIDATE = Component(tpo_token, ("tpo_eta",), grouped=True, candidates=True,
                       own_aggregation="token_mean", own_credit=True, reads_distribution=True)
TPO_OBJECTIVES: dict[str, Objective] = {
    "tpo": _GROUP,
    "tpo_no_anchor": dataclasses.replace(_GROUP, fn=tpo_no_anchor),
    "group_pg": dataclasses.replace(_GROUP, fn=group_pg),
    "tpo_full_action": Component(tpo_full_action, ("tpo_eta",), own_aggregation="token_mean",
                                 own_credit=True, reads_distribution=True),
    "tpo_token": _CANDIDATE,
    "grpo_token": dataclasses.replace(_CANDIDATE, fn=grpo_token, settings=(
        "clip_low", "clip_high", "candidate_kl")),
}
"""The TPO family's records (part of `rlscope.methods.objectives.OBJECTIVES`)."""
