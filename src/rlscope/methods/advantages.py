"""Advantage estimators (METHODS.md, "Advantage estimators").

Each estimator is a pure function ``(AdvantageInputs, AdvantageConfig) -> adv_BT`` returning a
per-token advantage (sequence estimators broadcast over the completion), zero where
``mask_BT`` is 0. Groups are contiguous blocks of ``group_size`` rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlscope.methods.spec import AdvantageConfig

EPS = 1e-8


@dataclass(frozen=True)
class AdvantageInputs:
    """What an estimator may read. Optional fields are None when the loop did not compute them.

    - ``rewards_B``: scalar (training) rewards. ``mask_BT``: loss mask.
    - ``expected_reward_B``: exact E[r | x] under the behaviour policy, where exposed.
    - ``sum_p2_BT``: Σ_v π(v | prefix)² from the current learner (detached), the ``expected``
      fallback baseline. ``score_mask_BT``: scored positions (baseline is 0 elsewhere).
    - ``values_BT``: critic values V(s_t) before each generated token. ``token_rewards_BT``:
      extra per-token rewards (KL shaping), added on every token for ``gae``.
    """

    rewards_B: torch.Tensor
    mask_BT: torch.Tensor
    group_size: int = 1
    expected_reward_B: torch.Tensor | None = None
    sum_p2_BT: torch.Tensor | None = None
    score_mask_BT: torch.Tensor | None = None
    values_BT: torch.Tensor | None = None
    token_rewards_BT: torch.Tensor | None = None


def _groups(x_B: torch.Tensor, group_size: int) -> torch.Tensor:
    if x_B.shape[0] % group_size:
        raise ValueError(f"{x_B.shape[0]} rows do not split into groups of {group_size}")
    return x_B.view(-1, group_size)


def _broadcast(adv_B: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    return adv_B[:, None] * mask_BT


def expected(x: AdvantageInputs, cfg: AdvantageConfig) -> torch.Tensor:
    """A = r − b with b = E[r | x] when exposed, else per token b_t = Σ_v π(v | prefix)².

    The Σπ² baseline is the expected per-position match of a sample with the greedy label,
    the natural baseline for fractional token rewards; it is 0 at unscored positions.
    Source: the delight-gradient sandbox. Regime: any task; exact when rewards are clean.
    """
    if x.expected_reward_B is not None:
        return _broadcast(x.rewards_B - x.expected_reward_B, x.mask_BT)
    if x.sum_p2_BT is None:
        raise ValueError("advantage 'expected' needs sum_p2_BT or expected_reward_B")
    baseline_BT = x.sum_p2_BT
    if x.score_mask_BT is not None:
        baseline_BT = baseline_BT * x.score_mask_BT
    return (x.rewards_B[:, None] - baseline_BT) * x.mask_BT


def constant(x: AdvantageInputs, cfg: AdvantageConfig) -> torch.Tensor:
    """A = r − 0.5."""
    return _broadcast(x.rewards_B - 0.5, x.mask_BT)


def zero(x: AdvantageInputs, cfg: AdvantageConfig) -> torch.Tensor:
    """A = r (no baseline)."""
    return _broadcast(x.rewards_B, x.mask_BT)


def group_zscore(x: AdvantageInputs, cfg: AdvantageConfig) -> torch.Tensor:
    """A_i = (r_i − mean_g) / (std_g + 1e-8), 0 when std_g ≤ 1e-8 (GRPO, arXiv:2402.03300).

    ``cfg.std_floor`` clamps std_g from below first (the 1/σ amplification guard).
    """
    r_GK = _groups(x.rewards_B, x.group_size)
    centred_GK = r_GK - r_GK.mean(-1, keepdim=True)
    std_G1 = r_GK.std(-1, unbiased=False, keepdim=True)
    denom_G1 = std_G1.clamp_min(cfg.std_floor) + EPS
    adv_GK = torch.where(std_G1 > EPS, centred_GK / denom_G1, torch.zeros_like(centred_GK))
    return _broadcast(adv_GK.reshape(-1), x.mask_BT)


def group_center(x: AdvantageInputs, cfg: AdvantageConfig) -> torch.Tensor:
    """A_i = r_i − mean_g (Dr. GRPO, arXiv:2503.20783)."""
    r_GK = _groups(x.rewards_B, x.group_size)
    return _broadcast((r_GK - r_GK.mean(-1, keepdim=True)).reshape(-1), x.mask_BT)


def rloo(x: AdvantageInputs, cfg: AdvantageConfig) -> torch.Tensor:
    """A_i = r_i − mean of the other G − 1 rewards (RLOO, arXiv:2402.14740). Needs G > 1."""
    r_GK = _groups(x.rewards_B, x.group_size)
    K = r_GK.shape[1]
    if K < 2:
        raise ValueError("advantage 'rloo' needs group_size > 1")
    others_GK = (r_GK.sum(-1, keepdim=True) - r_GK) / (K - 1)
    return _broadcast((r_GK - others_GK).reshape(-1), x.mask_BT)


def whiten(x_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """(x − mean) / (std + 1e-8) over the valid tokens; 0 where masked."""
    n = mask_BT.sum().clamp_min(1.0)
    mean = (x_BT * mask_BT).sum() / n
    var = (((x_BT - mean) * mask_BT) ** 2).sum() / n
    return (x_BT - mean) / (var.sqrt() + EPS) * mask_BT


def gae_returns(rewards_BT: torch.Tensor, values_BT: torch.Tensor, mask_BT: torch.Tensor,
                gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over generated tokens (Schulman et al., 1506.02438).

    δ_t = r_t + γ V_{t+1} − V_t, A_t = δ_t + γ λ A_{t+1}, with V and A zero after the last valid
    token. Returns ``(advantages_BT, returns_BT)`` with returns = A + V (unwhitened).
    """
    T = rewards_BT.shape[1]
    values_BT = values_BT * mask_BT
    next_value_B = torch.zeros_like(values_BT[:, 0])
    running_B = torch.zeros_like(next_value_B)
    adv_cols = []
    for t in range(T - 1, -1, -1):
        delta_B = rewards_BT[:, t] + gamma * next_value_B - values_BT[:, t]
        running_B = (delta_B + gamma * lam * running_B) * mask_BT[:, t]
        adv_cols.append(running_B)
        next_value_B = values_BT[:, t]
    adv_BT = torch.stack(adv_cols[::-1], 1)
    return adv_BT, (adv_BT + values_BT) * mask_BT


def last_token_rewards(rewards_B: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """The scalar reward placed on each row's last valid token, ``[B, T]``."""
    T = mask_BT.shape[1]
    idx_T = torch.arange(T, device=mask_BT.device, dtype=mask_BT.dtype)
    last_B = (mask_BT * (idx_T + 1)).argmax(-1)
    out_BT = torch.zeros_like(mask_BT)
    return out_BT.scatter(1, last_B[:, None], rewards_B[:, None].to(out_BT.dtype)) * mask_BT


def gae_with_returns(x: AdvantageInputs, cfg: AdvantageConfig
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Whitened GAE advantages and the (unwhitened) value targets, ``(adv_BT, returns_BT)``."""
    if x.values_BT is None:
        raise ValueError("advantage 'gae' needs values_BT (a value head)")
    rewards_BT = last_token_rewards(x.rewards_B, x.mask_BT)
    if x.token_rewards_BT is not None:
        rewards_BT = rewards_BT + x.token_rewards_BT * x.mask_BT
    adv_BT, returns_BT = gae_returns(rewards_BT, x.values_BT, x.mask_BT, cfg.gamma, cfg.lam)
    return whiten(adv_BT, x.mask_BT), returns_BT


def gae(x: AdvantageInputs, cfg: AdvantageConfig) -> torch.Tensor:
    """GAE with a critic; scalar reward on the last token plus per-token shaping, whitened.

    Source: PPO for RLHF (Ziegler et al. 1909.08593; Ouyang et al. 2203.02155). Needs a value
    head; `gae_with_returns` also gives the value targets.
    """
    return gae_with_returns(x, cfg)[0]


Estimator = Callable[[AdvantageInputs, AdvantageConfig], torch.Tensor]

ADVANTAGES: dict[str, Estimator] = {
    "expected": expected,
    "constant": constant,
    "zero": zero,
    "group_zscore": group_zscore,
    "group_center": group_center,
    "rloo": rloo,
    "gae": gae,
}
GROUPED_ADVANTAGES = frozenset({"group_zscore", "group_center", "rloo"})


def compute_advantages(x: AdvantageInputs, cfg: AdvantageConfig) -> torch.Tensor:
    """Run the configured estimator, then the optional |A| clip. Returns ``adv_BT``."""
    adv_BT = ADVANTAGES[cfg.name](x, cfg)
    if cfg.clip > 0:
        adv_BT = adv_BT.clamp(-cfg.clip, cfg.clip)
    return adv_BT
