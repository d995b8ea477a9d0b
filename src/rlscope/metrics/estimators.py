"""Metric estimators: pure functions from detached tensors to ``{name: 0-d tensor}``.

Nothing here calls ``.item()``: the loop turns one step's metrics into floats once.
"""

from __future__ import annotations

import torch

Metrics = dict[str, torch.Tensor]
LOG_RATIO_CLAMP = 20.0
"""Bound on a log-ratio ℓ − ℓ_μ before it is exponentiated, here and in the objectives'
ratio ρ (`methods.terms.ratio`), so exp never overflows."""
EPS = 1e-8


def masked_mean(x_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    return (x_BT * mask_BT).sum() / mask_BT.sum().clamp_min(1.0)


def population_mean(x_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """Mean of ``x_BT`` over the valid tokens where it is not NaN: an objective statistic marks
    the tokens outside its population with NaN (dppo's masked fractions are over the tokens
    with A ≠ 0), so its denominator is that population; 0 when the population is empty."""
    in_BT = mask_BT.bool() & ~x_BT.isnan()
    return masked_mean(torch.where(in_BT, x_BT, 0.0), in_BT.to(x_BT.dtype))


def masked_max(x_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    return x_BT.masked_fill(mask_BT == 0, float("-inf")).max()


def masked_min(x_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    return x_BT.masked_fill(mask_BT == 0, float("inf")).min()


def masked_std(x_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    mean = masked_mean(x_BT, mask_BT)
    return masked_mean((x_BT - mean).square(), mask_BT).sqrt()


def reward_metrics(rewards_B: torch.Tensor, raw_rewards_B: torch.Tensor) -> Metrics:
    return {"reward/mean": rewards_B.mean(), "reward/std": rewards_B.std(unbiased=False),
            "reward/min": rewards_B.min(), "reward/max": rewards_B.max(),
            "reward/raw_mean": raw_rewards_B.mean()}


def advantage_metrics(adv_BT: torch.Tensor, mask_BT: torch.Tensor, rewards_B: torch.Tensor,
                      group_size: int) -> Metrics:
    """``adv/`` metrics; the group statistics use contiguous groups of ``group_size`` rows."""
    out = {"adv/mean": masked_mean(adv_BT, mask_BT),
           "adv/abs_mean": masked_mean(adv_BT.abs(), mask_BT),
           "adv/std": masked_std(adv_BT, mask_BT),
           "adv/min": masked_min(adv_BT, mask_BT), "adv/max": masked_max(adv_BT, mask_BT),
           "adv/frac_zero": masked_mean((adv_BT.abs() < EPS).float(), mask_BT)}
    if group_size > 1 and rewards_B.shape[0] % group_size == 0:
        r_GK = rewards_B.view(-1, group_size)
        std_G = r_GK.std(-1, unbiased=False)
        gap_B = (r_GK - r_GK.mean(-1, keepdim=True)).abs().reshape(-1)
        seq_abs_adv_B = (adv_BT.abs() * mask_BT).sum(-1) / mask_BT.sum(-1).clamp_min(1.0)
        out |= {"adv/group_std_mean": std_G.mean(), "adv/group_std_min": std_G.min(),
                "adv/amplification": seq_abs_adv_B.mean() / gap_B.mean().clamp_min(EPS)}
    return out


def group_outcome_metrics(rewards_B: torch.Tensor, group_size: int) -> Metrics:
    """``group/mixed_rate`` (reward std > 1e-6), ``group/all_zero_rate`` (every reward 0) and
    ``group/all_one_rate`` (every reward 1) over contiguous groups of ``group_size`` rows,
    before any selection; empty for ungrouped batches."""
    if group_size < 2 or rewards_B.shape[0] % group_size:
        return {}
    r_GK = rewards_B.view(-1, group_size)
    return {"group/mixed_rate": (r_GK.std(-1, unbiased=False) > 1e-6).float().mean(),
            "group/all_zero_rate": (r_GK == 0).all(-1).float().mean(),
            "group/all_one_rate": (r_GK == 1).all(-1).float().mean()}


def pass_metrics(logp_BT: torch.Tensor, logp_old_BT: torch.Tensor, mask_BT: torch.Tensor,
                 stats: dict[str, torch.Tensor], suffix: str) -> Metrics:
    """Ratio, KL-to-behaviour and objective statistics of one learner pass (detached inputs).

    ``suffix`` is ``""`` for the last pass and ``"_first"`` for the first.
    """
    d_BT = (logp_BT - logp_old_BT).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    rho_BT = d_BT.exp()
    out = {"policy/ratio_mean": masked_mean(rho_BT, mask_BT),
           "policy/ratio_min": masked_min(rho_BT, mask_BT),
           "policy/ratio_max": masked_max(rho_BT, mask_BT),
           "policy/kl_behaviour_k1": masked_mean(d_BT, mask_BT),
           "policy/kl_behaviour_k2": masked_mean(0.5 * d_BT.square(), mask_BT),
           "policy/kl_behaviour_k3": masked_mean(torch.expm1(-d_BT) + d_BT, mask_BT)}
    for name, x_BT in stats.items():
        if name.startswith("clipfrac"):
            out[f"policy/{name}"] = masked_mean(x_BT, mask_BT)
    out = {f"{k}{suffix}": v for k, v in out.items()}
    if not suffix:
        out["policy/approx_kl"] = masked_mean(0.5 * d_BT.square(), mask_BT)
        for name, x_BT in stats.items():
            if name in ROW_STATS:
                out[name] = row_mean(x_BT, mask_BT)
            elif "/" in name:
                out[name] = masked_mean(x_BT, mask_BT)
            elif not name.startswith("clipfrac"):
                prefix = "value" if name == "value_clipfrac" else "policy"
                key = "clipfrac" if name == "value_clipfrac" else name
                out[f"{prefix}/{key}"] = population_mean(x_BT, mask_BT)
    return out


ROW_STATS = frozenset({"gate/opsm_masked_seq_frac", "gate/opsm_D_mean"})
"""Objective/gate statistics that are constant along a row (a per-sequence value broadcast
to its tokens): `pass_metrics` reports their mean over sequences (`row_mean`), not over
tokens. A statistic whose name holds a ``/`` is reported under that name as it is."""


def row_mean(x_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """Mean over the rows with a valid token of each row's masked mean of ``x_BT``."""
    m_BT = mask_BT.to(x_BT.dtype)
    n_B = m_BT.sum(-1)
    has_B = n_B > 0
    per_row_B = (x_BT * m_BT).sum(-1) / n_B.clamp_min(1.0)
    return (per_row_B * has_B).sum() / has_B.sum().clamp_min(1)


def sampler_metrics(logp_learner_BT: torch.Tensor, logp_sampler_BT: torch.Tensor,
                    mask_BT: torch.Tensor) -> Metrics:
    """Sampler/learner mismatch on the first pass: exactly 0, 0, 0 and 1 when they agree."""
    d_BT = (logp_learner_BT - logp_sampler_BT).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    rho_BT = d_BT.exp() * mask_BT
    outside_BT = ((rho_BT < 0.9) | (rho_BT > 1.1)).float()
    n = mask_BT.sum().clamp_min(1.0)
    return {"sampler/logp_diff_mean": masked_mean(d_BT.abs(), mask_BT),
            "sampler/logp_diff_max": masked_max(d_BT.abs(), mask_BT),
            "sampler/frac_outside_band": masked_mean(outside_BT, mask_BT),
            "sampler/is_ess": rho_BT.sum().square() / (n * rho_BT.square().sum()).clamp_min(EPS)}


def length_metrics(mask_BT: torch.Tensor, finished_by_stop_B: torch.Tensor) -> Metrics:
    length_B = mask_BT.sum(-1)
    stop_B = finished_by_stop_B.float()
    return {"length/mean": length_B.mean(), "length/min": length_B.min(),
            "length/max": length_B.max(), "length/terminated_mean": stop_B.mean(),
            "length/clip_ratio": 1.0 - stop_B.mean()}


def value_metrics(values_BT: torch.Tensor, returns_BT: torch.Tensor,
                  mask_BT: torch.Tensor) -> Metrics:
    err_BT = returns_BT - values_BT
    var_r = masked_std(returns_BT, mask_BT).square()
    var_err = masked_std(err_BT, mask_BT).square()
    return {"value/explained_var": 1.0 - var_err / var_r.clamp_min(EPS),
            "value/pred_mean": masked_mean(values_BT, mask_BT),
            "value/error": masked_mean(err_BT.square(), mask_BT)}
