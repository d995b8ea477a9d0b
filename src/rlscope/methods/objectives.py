"""Per-token policy objectives (METHODS.md, "Objectives").

An objective is a pure function ``(PolicyTerms, ObjectiveConfig) -> (loss_BT, stats)``:
``loss_BT`` is the per-token loss before aggregation (masked positions arbitrary; aggregation
applies the mask) and ``stats`` maps names to per-token detached tensors that the metric schema
reduces over valid tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlscope.methods.spec import ObjectiveConfig

LOG_RATIO_CLAMP = 20.0


@dataclass(frozen=True)
class PolicyTerms:
    """Inputs shared by all objectives.

    ``logp_BT``: current learner log-prob of each action token (differentiable).
    ``logp_old_BT``: behaviour log-prob ``ℓ_μ`` stored at sampling time.
    ``weight_BT``: the gated advantage ``w`` (detached). ``mask_BT``: loss mask.
    """

    logp_BT: torch.Tensor
    logp_old_BT: torch.Tensor
    weight_BT: torch.Tensor
    mask_BT: torch.Tensor


ObjectiveOut = tuple[torch.Tensor, dict[str, torch.Tensor]]


def ratio(logp_BT: torch.Tensor, logp_old_BT: torch.Tensor) -> torch.Tensor:
    """ρ = exp(clamp(ℓ − ℓ_μ, −20, 20))."""
    return torch.exp((logp_BT - logp_old_BT).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


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
    rho_BT = ratio(x.logp_BT, x.logp_old_BT)
    adv_BT = x.weight_BT.detach()
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


def ce_oracle(x: PolicyTerms, cfg: ObjectiveConfig) -> ObjectiveOut:
    """Cross-entropy on the ground-truth continuation (teacher-forced on the true prefix).

    A supervised upper bound, not like-for-like with RL: it ignores rewards and rollouts.
    """
    return -x.logp_BT, {}


OBJECTIVES: dict[str, Callable[[PolicyTerms, ObjectiveConfig], ObjectiveOut]] = {
    "score": score,
    "is_capped": is_capped,
    "ppo_clip": ppo_clip,
    "ce_oracle": ce_oracle,
}
