"""Batch statistics: token selections chosen over the whole optimizer (mini)batch.

METHODS_2026.md §1: Clip-Cov's and KL-Cov's covariance selections and the high-entropy gate's
quantile are computed once per optimizer step, before its update, from detached
current-policy quantities of every row of the minibatch — never per micro-batch, so
micro-batching never changes the update. A component that needs one names its selection
function in its record (``Component.batch_statistic``); `rlscope.learner.update` runs one
no-grad forward over the minibatch, calls it and passes the selection to the component as
``select_BT`` (`PolicyTerms.select_BT` / `GateInputs.select_BT`).

A selection function is ``(BatchStatInputs, axis config) -> (select_BT, metrics)``:
``select_BT`` is 1.0 on the selected tokens and 0.0 elsewhere (masked positions 0), and
``metrics`` maps metric names to 0-d detached tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rlscope.methods.configs import GateConfig, ObjectiveConfig
from rlscope.metrics.estimators import masked_mean

BatchStatOut = tuple[torch.Tensor, dict[str, torch.Tensor]]
BatchStatistic = Callable[["BatchStatInputs", Any], BatchStatOut]


@dataclass(frozen=True)
class BatchStatInputs:
    """The optimizer minibatch's detached quantities, all [B, T] over its rows.

    ``adv_BT``: advantages; ``logp_BT``: the current learner's log-prob ℓ of each sampled
    token (at the first optimizer step of a rollout step, ℓ_o); ``logp_old_BT``: behaviour
    log-probs ℓ_μ; ``entropy_BT``: the current learner's categorical entropy H_t;
    ``mask_BT``: valid tokens; ``generator``: the seeded stream of random draws (Clip-Cov),
    seeded from the run seed, the step and the optimizer step.
    """

    adv_BT: torch.Tensor
    logp_BT: torch.Tensor
    logp_old_BT: torch.Tensor
    entropy_BT: torch.Tensor
    mask_BT: torch.Tensor
    generator: torch.Generator


def covariance_BT(adv_BT: torch.Tensor, logp_BT: torch.Tensor,
                  mask_BT: torch.Tensor) -> torch.Tensor:
    """C_t = (A_t − Ā)(ℓ_t − ℓ̄), means over valid tokens; 0 at masked positions."""
    valid_BT = mask_BT > 0
    adv_mean, logp_mean = masked_mean(adv_BT, valid_BT), masked_mean(logp_BT, valid_BT)
    return torch.where(valid_BT, (adv_BT - adv_mean) * (logp_BT - logp_mean),
                       torch.zeros_like(adv_BT))


def _count(ratio: float, n_valid: int) -> int:
    return max(1, int(ratio * n_valid))


def _cov_metrics(cov_BT: torch.Tensor, select_BT: torch.Tensor,
                 valid_BT: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"cov/selected_frac": masked_mean(select_BT, valid_BT),
            "cov/mean": masked_mean(cov_BT, valid_BT),
            "cov/selected_mean": masked_mean(cov_BT, select_BT)}


def clip_cov_select(x: BatchStatInputs, cfg: ObjectiveConfig) -> BatchStatOut:
    """Clip-Cov's selection (Cui et al. 2505.22617; verl ``compute_policy_loss_clip_cov``).

    Candidates: valid tokens with ``clip_cov_low`` < C_t < ``clip_cov_high`` whose PPO clipped
    branch is not active (−A·clip(ρ) ≤ −Aρ); k = max(1, ⌊r·N⌋) of them (r =
    ``clip_cov_ratio``, N valid tokens; all of them if fewer) drawn uniformly from
    ``x.generator``. Logs ``cov/selected_frac``, ``cov/mean``, ``cov/selected_mean``.
    """
    valid_BT = x.mask_BT > 0
    cov_BT = covariance_BT(x.adv_BT, x.logp_BT, x.mask_BT)
    rho_BT = torch.exp(x.logp_BT - x.logp_old_BT)
    clipped_active_BT = (-x.adv_BT * rho_BT.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
                         > -x.adv_BT * rho_BT)
    cand_BT = valid_BT & (cov_BT > cfg.clip_cov_low) & (cov_BT < cfg.clip_cov_high) \
        & ~clipped_active_BT
    cand_N = cand_BT.flatten().nonzero().squeeze(-1)
    k = min(_count(cfg.clip_cov_ratio, int(valid_BT.sum())), int(cand_N.numel()))
    order_N = torch.randperm(int(cand_N.numel()), generator=x.generator)[:k]
    select_N = torch.zeros(cov_BT.numel(), dtype=cov_BT.dtype, device=cov_BT.device)
    select_N[cand_N[order_N.to(cand_N.device)]] = 1.0
    select_BT = select_N.view_as(cov_BT)
    return select_BT, _cov_metrics(cov_BT, select_BT, valid_BT)


def kl_cov_select(x: BatchStatInputs, cfg: ObjectiveConfig) -> BatchStatOut:
    """KL-Cov's selection (Cui et al. 2505.22617): the k = max(1, ⌊k_r·N⌋) valid tokens with
    the largest C_t (k_r = ``kl_cov_ratio``, N valid tokens). Same metrics as Clip-Cov."""
    valid_BT = x.mask_BT > 0
    cov_BT = covariance_BT(x.adv_BT, x.logp_BT, x.mask_BT)
    n_valid = int(valid_BT.sum())
    select_N = torch.zeros(cov_BT.numel(), dtype=cov_BT.dtype, device=cov_BT.device)
    if n_valid:
        scores_N = cov_BT.flatten().masked_fill(~valid_BT.flatten(), float("-inf"))
        top_N = torch.topk(scores_N, min(_count(cfg.kl_cov_ratio, n_valid), n_valid)).indices
        select_N[top_N] = 1.0
    select_BT = select_N.view_as(cov_BT)
    return select_BT, _cov_metrics(cov_BT, select_BT, valid_BT)


def linear_quantile(x_N: torch.Tensor, q: float) -> torch.Tensor:
    """``torch.quantile(x_N, q)`` (linear interpolation between the two nearest ranks) from a
    sort, so any size and dtype works: ``torch.quantile`` refuses more than 2^24 numbers (a
    minibatch of ~16.7M valid tokens) and low-precision floats."""
    sorted_N = x_N.float().sort().values if x_N.dtype in (torch.float16, torch.bfloat16) \
        else x_N.sort().values
    # the rank in the input's dtype, as torch.quantile computes it (the same bits)
    rank = torch.tensor(q, dtype=sorted_N.dtype) * (sorted_N.numel() - 1)
    lo = int(rank.floor())
    hi = min(lo + 1, sorted_N.numel() - 1)
    return torch.lerp(sorted_N[lo], sorted_N[hi], (rank - lo).to(sorted_N.device))


def entropy_top_select(x: BatchStatInputs, cfg: GateConfig) -> BatchStatOut:
    """The high-entropy ("forking") tokens (Wang et al. 2506.01939): H_t ≥ τ, τ the linearly
    interpolated (1 − ρ_H)-quantile of H over the valid tokens (ρ_H = ``entropy_top_frac``;
    ρ_H = 1 keeps every token). Logs ``gate/kept_frac``, ``gate/entropy_threshold`` and the
    mean entropy of the kept and dropped tokens."""
    valid_BT = x.mask_BT > 0
    h_N = x.entropy_BT[valid_BT]
    if h_N.numel() == 0:
        zero = x.entropy_BT.new_zeros(())
        return torch.zeros_like(x.entropy_BT), {
            "gate/kept_frac": zero, "gate/entropy_threshold": zero,
            "policy/entropy_kept": zero, "policy/entropy_dropped": zero}
    tau = linear_quantile(h_N, 1.0 - cfg.entropy_top_frac)
    keep_BT = valid_BT & (x.entropy_BT >= tau)
    drop_BT = valid_BT & ~keep_BT
    h_BT = x.entropy_BT
    return keep_BT.to(h_BT.dtype), {
        "gate/kept_frac": keep_BT.sum().to(h_BT.dtype) / valid_BT.sum(),
        "gate/entropy_threshold": tau,
        "policy/entropy_kept": masked_mean(h_BT, keep_BT),
        "policy/entropy_dropped": masked_mean(h_BT, drop_BT)}
