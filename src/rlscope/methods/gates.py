"""Influence gates: turn an advantage into the weight the objective uses (METHODS.md).

A gate is a pure function ``(x: GateInputs, cfg) -> (weight_BT, stats)``. ``x.logp_BT`` is the
current learner's log-prob of the sampled token, detached; the optional inputs are read only by
the gates that need them, which raise a ValueError naming the missing input. ``stats`` holds
per-token (B, T) detached tensors the metric schema reduces over valid tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlscope.methods.batch_stats import entropy_top_select
from rlscope.methods.component import Component
from rlscope.methods.configs import GateConfig

GateOut = tuple[torch.Tensor, dict[str, torch.Tensor]]


@dataclass(frozen=True)
class GateInputs:
    """What a gate reads; all tensors detached.

    - ``adv_BT``: advantages.
    - ``logp_BT``: the current learner's log-prob ℓ of the sampled token.
    - ``uncertainty_B``: reward uncertainty u per sample — the within-group reward std (the
      population std of the group's scalar rewards) for grouped batches, or the single
      whole-batch reward std broadcast to every sample for ungrouped ones; see
      `reward_uncertainty_B`. Read by the ``uncertainty_*`` gates.
    - ``probs_mean_BT``: mean_v π(v | prefix) over the vocabulary, read by ``entropy_guard``.
      A distribution over V tokens sums to 1, so this is exactly 1/V at every position (also
      under a top-k/top-p kept set, whose dropped tokens have probability 0); `probs_mean_BT`
      builds it.
    - ``age_B``: how many optimizer steps ago each sample was drawn, read by ``freshness``.
    - ``select_BT``: the gate's batch-statistic token selection (1.0 = kept), chosen over the
      whole optimizer minibatch (`rlscope.methods.batch_stats`), read by ``entropy_top``.
    - ``logp_sampler_BT``: the sampler's log-prob ℓ_s of the sampled token and ``mask_BT``
      the loss mask, read by ``opsm``.
    """

    adv_BT: torch.Tensor
    logp_BT: torch.Tensor
    uncertainty_B: torch.Tensor | None = None
    probs_mean_BT: torch.Tensor | None = None
    age_B: torch.Tensor | None = None
    select_BT: torch.Tensor | None = None
    logp_sampler_BT: torch.Tensor | None = None
    mask_BT: torch.Tensor | None = None


def probs_mean_BT(logp_BT: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """mean_v π(v | prefix) = 1/V for every position, shaped and typed like ``logp_BT``."""
    if vocab_size < 1:
        raise ValueError(f"vocab_size={vocab_size} must be >= 1")
    return torch.full_like(logp_BT, 1.0 / vocab_size)


def reward_uncertainty_B(rewards_B: torch.Tensor, group_size: int) -> torch.Tensor:
    """Per-sample reward uncertainty u, shape (B,).

    With ``group_size > 1`` (rows of a group contiguous) u is the population std of the
    sample's group rewards; with ``group_size == 1`` it is the population std of all B rewards,
    broadcast to every sample (the ungrouped fallback of METHODS.md).
    """
    if rewards_B.dim() != 1:
        raise ValueError(f"rewards_B must be 1-D, got shape {tuple(rewards_B.shape)}")
    B = rewards_B.shape[0]
    if group_size < 1 or B % group_size != 0:
        raise ValueError(f"group_size={group_size} must be >= 1 and divide the batch size {B}")
    if group_size == 1:
        return rewards_B.std(unbiased=False).expand(B).clone()
    std_G1 = rewards_B.view(-1, group_size).std(-1, unbiased=False, keepdim=True)
    return std_G1.expand(-1, group_size).reshape(B)


def _require(value: torch.Tensor | None, name: str, gate: str) -> torch.Tensor:
    if value is None:
        raise ValueError(f"gate {gate!r} needs GateInputs.{name}, which is None")
    return value


def _per_token(x_B: torch.Tensor, like_BT: torch.Tensor) -> torch.Tensor:
    """A per-sample (B,) tensor broadcast to (B, T) in ``like_BT``'s dtype."""
    return x_B.to(like_BT.dtype)[:, None].expand_as(like_BT)


def _delight_gate(adv_BT: torch.Tensor, logp_BT: torch.Tensor, eta: float) -> torch.Tensor:
    return torch.sigmoid(adv_BT * (-logp_BT) / eta)


def no_gate(x: GateInputs, cfg: GateConfig) -> GateOut:
    """w = A."""
    return x.adv_BT, {}


def delight(x: GateInputs, cfg: GateConfig) -> GateOut:
    """Delightful policy gradient: g = σ(A·(−ℓ)/η), w = g·A.

    Surprising successes (A > 0, low π(a)) pass; surprising failures are damped. As η → ∞,
    g → 1/2 and the update is REINFORCE / 2. Source: the delight-gradient sandbox (DG).
    Regime: η > 0; any advantage estimator.
    """
    gate_BT = _delight_gate(x.adv_BT, x.logp_BT, cfg.eta)
    return gate_BT * x.adv_BT, {"gate_mean": gate_BT}


def uncertainty_shift(x: GateInputs, cfg: GateConfig) -> GateOut:
    """UncertaintyDG: g = σ((A·(−ℓ) − s·u)/η), w = g·A.

    Uncertain rewards (large u) shift the gate down. s = 0 is DG exactly. Source: the
    delight-gradient sandbox. Regime: η > 0, s ≥ 0; needs ``uncertainty_B``.
    """
    u_BT = _per_token(_require(x.uncertainty_B, "uncertainty_B", "uncertainty_shift"), x.adv_BT)
    gate_BT = torch.sigmoid((x.adv_BT * (-x.logp_BT) - cfg.s * u_BT) / cfg.eta)
    return gate_BT * x.adv_BT, {"gate_mean": gate_BT, "uncertainty_mean": u_BT}


def uncertainty_filter(x: GateInputs, cfg: GateConfig) -> GateOut:
    """FilteredDG: w = 1[u ≤ τ] · σ(A·(−ℓ)/η) · A.

    Samples whose reward std exceeds τ are dropped; the kept ones get the DG weight, so a τ
    above every std is DG bit for bit. Source: the delight-gradient sandbox. Regime: η > 0;
    needs ``uncertainty_B``. Logs ``kept_frac`` and ``uncertainty_mean``.
    """
    u_BT = _per_token(_require(x.uncertainty_B, "uncertainty_B", "uncertainty_filter"),
                      x.adv_BT)
    keep_BT = (u_BT <= cfg.tau).to(x.adv_BT.dtype)
    gate_BT = _delight_gate(x.adv_BT, x.logp_BT, cfg.eta)
    weight_BT = gate_BT * x.adv_BT * keep_BT
    return weight_BT, {"gate_mean": gate_BT, "kept_frac": keep_BT, "uncertainty_mean": u_BT}


def uncertainty_shrink(x: GateInputs, cfg: GateConfig) -> GateOut:
    """RewardVarianceDG: A′ = A/(1 + s·u); w = σ(A′·(−ℓ)/η)·A′.

    The advantage is shrunk by the reward uncertainty before the DG gate; u = 0 is DG exactly.
    Source: the delight-gradient sandbox. Regime: η > 0, s·u > −1; needs ``uncertainty_B``.
    """
    u_BT = _per_token(_require(x.uncertainty_B, "uncertainty_B", "uncertainty_shrink"),
                      x.adv_BT)
    adv_BT = x.adv_BT / (1.0 + cfg.s * u_BT)
    gate_BT = _delight_gate(adv_BT, x.logp_BT, cfg.eta)
    return gate_BT * adv_BT, {"gate_mean": gate_BT, "uncertainty_mean": u_BT}


def entropy_guard(x: GateInputs, cfg: GateConfig) -> GateOut:
    """DGEntropyGuard: DG weight × (1 − s·clamp(π(a) − mean_v π(v), 0, 1)) where A > 0.

    Damps positive updates on tokens already more likely than the vocabulary average (1/V),
    which would otherwise collapse entropy; A ≤ 0 keeps the DG weight. s = ``guard_scale``;
    s = 0 is DG exactly. Source: the delight-gradient sandbox. Regime: η > 0, 0 ≤ s ≤ 1;
    needs ``probs_mean_BT``. Logs ``entropy_guard_mean`` (the factor, 1 where A ≤ 0).
    """
    mean_BT = _require(x.probs_mean_BT, "probs_mean_BT", "entropy_guard")
    excess_BT = (x.logp_BT.exp() - mean_BT).clamp(0.0, 1.0)
    factor_BT = torch.where(x.adv_BT > 0, 1.0 - cfg.guard_scale * excess_BT,
                            torch.ones_like(excess_BT))
    gate_BT = _delight_gate(x.adv_BT, x.logp_BT, cfg.eta)
    weight_BT = gate_BT * x.adv_BT * factor_BT
    return weight_BT, {"gate_mean": gate_BT, "entropy_guard_mean": factor_BT}


def freshness(x: GateInputs, cfg: GateConfig) -> GateOut:
    """FreshDG: DG weight × exp(−λ_age · age), λ_age = ``gate_age_decay``.

    Replayed (stale) batches count less; age 0 is DG exactly. Source: the delight-gradient
    sandbox. Regime: η > 0, λ_age ≥ 0; needs ``age_B``. Logs ``freshness_weight``, ``batch_age``.
    """
    age_BT = _per_token(_require(x.age_B, "age_B", "freshness"), x.adv_BT)
    fresh_BT = torch.exp(-cfg.gate_age_decay * age_BT)
    gate_BT = _delight_gate(x.adv_BT, x.logp_BT, cfg.eta)
    weight_BT = gate_BT * x.adv_BT * fresh_BT
    return weight_BT, {"gate_mean": gate_BT, "freshness_weight": fresh_BT, "batch_age": age_BT}


def entropy_top(x: GateInputs, cfg: GateConfig) -> GateOut:
    """High-entropy token gate: w_t = 1[H_t ≥ τ]·A_t ("forking tokens", the 80/20 rule).

    Wang et al. 2506.01939 (TRL ``top_entropy_quantile``). τ is the (1 − ρ_H)-quantile of the
    entropies of the whole optimizer minibatch (a batch statistic,
    `rlscope.methods.batch_stats.entropy_top_select`, read as ``select_BT``; TRL takes it per
    micro-batch). Dropped tokens keep their place in the denominators. ρ_H = 1 is no gate.
    """
    keep_BT = _require(x.select_BT, "select_BT", "entropy_top")
    return keep_BT * x.adv_BT, {}
def opsm(x: GateInputs, cfg: GateConfig) -> GateOut:
    """DeepSeek-V3.2 off-policy sequence masking: w = 0 on all of row i if A_i < 0 and
    D_i > δ, else w = A.

    D_i = mean_t (ℓ_s,t − sg ℓ_t) over the row's valid tokens, with the **current** ℓ at every
    pass (so later inner epochs see the policy move), ℓ_s the sampler's log-prob; A_i is the
    row's mean advantage over its valid tokens (the sequence advantage of ``grpo``). A dropped
    row keeps its mask (it still counts in the denominators). δ = ``opsm_delta`` (0.5, TRL's
    suggestion; the paper gives no value). Source: DeepSeek-V3.2 (2512.02556); TRL.
    Regime: needs sampler log-probs; δ > 0; with ℓ_s = ℓ on the first pass D = 0 and nothing is
    masked. Logs ``gate/opsm_masked_seq_frac`` and ``gate/opsm_D_mean`` (per row).
    """
    logp_s_BT = _require(x.logp_sampler_BT, "logp_sampler_BT", "opsm")
    m_BT = _require(x.mask_BT, "mask_BT", "opsm").to(x.adv_BT.dtype)
    n_B = m_BT.sum(-1).clamp_min(1.0)
    d_B = ((logp_s_BT - x.logp_BT.detach()) * m_BT).sum(-1) / n_B
    adv_B = (x.adv_BT * m_BT).sum(-1) / n_B
    drop_B = (adv_B < 0) & (d_B > cfg.opsm_delta)
    weight_BT = torch.where(drop_B[:, None], torch.zeros_like(x.adv_BT), x.adv_BT)
    return weight_BT, {"gate/opsm_masked_seq_frac": _per_token(drop_B, x.adv_BT),
                       "gate/opsm_D_mean": _per_token(d_B, x.adv_BT)}


Gate = Component[[GateInputs, GateConfig], GateOut]

_DG = ("eta",)
GATES: dict[str, Gate] = {
    "none": Component(no_gate, identity=True),
    "delight": Component(delight, _DG),
    "uncertainty_shift": Component(uncertainty_shift, (*_DG, "s")),
    "uncertainty_filter": Component(uncertainty_filter, (*_DG, "tau")),
    "uncertainty_shrink": Component(uncertainty_shrink, (*_DG, "s")),
    "entropy_guard": Component(entropy_guard, (*_DG, "guard_scale")),
    "freshness": Component(freshness, (*_DG, "gate_age_decay")),
    "entropy_top": Component(entropy_top, ("entropy_top_frac",),
                             batch_statistic=entropy_top_select),
    "opsm": Component(opsm, ("opsm_delta",), sampler_mismatch=True),
}
