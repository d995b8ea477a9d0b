"""Advantage estimators (METHODS.md, "Advantage estimators").

Each estimator is a pure function ``(AdvantageInputs, AdvantageConfig) -> adv_BT`` returning a
per-token advantage (sequence estimators broadcast over the completion), zero where
``mask_BT`` is 0. Groups are contiguous blocks of ``group_size`` rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlscope.methods.component import Component
from rlscope.methods.configs import AdvantageConfig

EPS = 1e-8


@dataclass(frozen=True)
class AdvantageInputs:
    """What an estimator may read. Optional fields are None when the loop did not compute them.

    - ``rewards_B``: scalar (training) rewards. ``mask_BT``: loss mask.
    - ``expected_reward_B``: exact E[r | x] under the behaviour policy, where exposed.
    - ``sum_p2_BT``: Σ_v π(v | prefix)² from the current learner (detached), the ``expected``
      fallback baseline. ``score_mask_BT``: scored positions (``rtg`` and ``self_distill``
      zero the baseline elsewhere; ``expected`` does not).
    - ``values_BT``: critic values V(s_t) before each generated token. ``token_rewards_BT``:
      extra per-token rewards (KL shaping), added on every token for ``gae`` and
      ``reinforce_pp``.
    - ``token_correct_BT``: 1 where the generated token equals the target token at that
      position, else 0 (``rtg``); only read at scored positions.
    - ``completion_tokens_BT``: the generated token ids, aligned with ``mask_BT`` (``tempo``
      compares them to find shared prefixes within a group).
    - ``greedy_rewards_B``: reward of a greedy rollout of each row's prompt (``remax``).
    - ``teacher_logp_BT``: a teacher's log-prob ℓ_T of each sampled token and
      ``behaviour_logp_BT`` the behaviour log-prob ℓ_μ (``teacher_rkl``).
    """

    rewards_B: torch.Tensor
    mask_BT: torch.Tensor
    group_size: int = 1
    expected_reward_B: torch.Tensor | None = None
    sum_p2_BT: torch.Tensor | None = None
    score_mask_BT: torch.Tensor | None = None
    values_BT: torch.Tensor | None = None
    token_rewards_BT: torch.Tensor | None = None
    token_correct_BT: torch.Tensor | None = None
    completion_tokens_BT: torch.Tensor | None = None
    greedy_rewards_B: torch.Tensor | None = None
    teacher_logp_BT: torch.Tensor | None = None
    behaviour_logp_BT: torch.Tensor | None = None


def _groups(x_B: torch.Tensor, group_size: int) -> torch.Tensor:
    if x_B.shape[0] % group_size:
        raise ValueError(f"{x_B.shape[0]} rows do not split into groups of {group_size}")
    return x_B.view(-1, group_size)


def _broadcast(adv_B: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    return adv_B[:, None] * mask_BT


def expected(x: AdvantageInputs, cfg: AdvantageConfig) -> torch.Tensor:
    """A = r − b with b = E[r | x] when exposed, else per token b_t = Σ_v π(v | prefix)².

    The Σπ² baseline is the expected per-position match of a sample with the greedy label,
    the natural baseline for fractional token rewards. It applies at every valid position,
    scored or not, as in the reference sandbox's ``_pg_core`` (METHODS.md zeroes it at
    unscored positions, which makes A_t = r > 0 there: a departure recorded in
    docs/reference_check.md). Only ``rtg`` and ``self_distill`` zero it off the score mask.
    Source: the delight-gradient sandbox. Regime: any task; exact when rewards are clean.
    """
    if x.expected_reward_B is not None:
        return _broadcast(x.rewards_B - x.expected_reward_B, x.mask_BT)
    if x.sum_p2_BT is None:
        raise ValueError("advantage 'expected' needs sum_p2_BT or expected_reward_B")
    return (x.rewards_B[:, None] - x.sum_p2_BT) * x.mask_BT


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
                gamma: float, lam: float | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over generated tokens (Schulman et al., 1506.02438).

    δ_t = r_t + γ V_{t+1} − V_t, A_t = δ_t + γ λ A_{t+1}, with V and A zero after the last valid
    token. Returns ``(advantages_BT, returns_BT)`` with returns = A + V (unwhitened). ``lam``
    may be a per-row ``[B]`` tensor (`gae_decoupled`).
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


def batch_zscore(x: AdvantageInputs, cfg: AdvantageConfig) -> torch.Tensor:
    """A_i = (r_i − mean_g) / (std_B + 1e-8): group mean removed, whole-batch reward std.

    std_B is the population std of all B scalar rewards (not of the centred values);
    ``cfg.std_floor`` clamps it from below; A = 0 everywhere when std_B ≤ 1e-8.
    Source: Lite-PPO (Liu et al., arXiv:2508.08221). Regime: grouped batches (G > 1; with G = 1
    every advantage is 0), any scalar reward.
    """
    r_GK = _groups(x.rewards_B, x.group_size)
    centred_GK = r_GK - r_GK.mean(-1, keepdim=True)
    std = x.rewards_B.std(unbiased=False)
    adv_GK = torch.where(std > EPS, centred_GK / (std.clamp_min(cfg.std_floor) + EPS),
                         torch.zeros_like(centred_GK))
    return _broadcast(adv_GK.reshape(-1), x.mask_BT)


def discounted_rtg(rewards_BT: torch.Tensor, mask_BT: torch.Tensor,
                   gamma: float) -> torch.Tensor:
    """G_t = Σ_{k ≥ t} γ^(k − t) m_k r_k per row, ``[B, T]``, 0 where masked.

    The discount counts positions, so a masked hole inside a row still costs a factor γ.
    """
    running_B = torch.zeros_like(rewards_BT[:, 0])
    cols = []
    for t in range(rewards_BT.shape[1] - 1, -1, -1):
        running_B = rewards_BT[:, t] * mask_BT[:, t] + gamma * running_B
        cols.append(running_B * mask_BT[:, t])
    return torch.stack(cols[::-1], 1)


def _reinforce_pp_from(rewards_B: torch.Tensor, x: AdvantageInputs,
                       cfg: AdvantageConfig) -> torch.Tensor:
    rewards_BT = last_token_rewards(rewards_B, x.mask_BT)
    if x.token_rewards_BT is not None:
        rewards_BT = rewards_BT + x.token_rewards_BT * x.mask_BT
    return whiten(discounted_rtg(rewards_BT, x.mask_BT, cfg.gamma), x.mask_BT)


def reinforce_pp(x: AdvantageInputs, cfg: AdvantageConfig) -> torch.Tensor:
    """REINFORCE++: per-token return-to-go with γ = ``cfg.gamma``, whitened over valid tokens.

    Per-token rewards: the scalar reward on each row's last valid token plus
    ``token_rewards_BT`` (KL shaping) on every valid token. A_t = whiten(Σ_{k≥t} γ^(k−t) r_k)
    over all valid tokens of the batch (population std, + 1e-8).
    Source: REINFORCE++ (Hu, arXiv:2501.03262). Regime: any task, no critic; needs more than
    one valid token with distinct returns for the whitening to be informative.
    """
    return _reinforce_pp_from(x.rewards_B, x, cfg)


def reinforce_pp_baseline(x: AdvantageInputs, cfg: AdvantageConfig) -> torch.Tensor:
    """REINFORCE++-baseline: r_i − mean_g first, then `reinforce_pp` (return-to-go, whiten).

    Source: REINFORCE++ (Hu, arXiv:2501.03262). Regime: grouped batches (G > 1).
    """
    r_GK = _groups(x.rewards_B, x.group_size)
    return _reinforce_pp_from((r_GK - r_GK.mean(-1, keepdim=True)).reshape(-1), x, cfg)


def rtg(x: AdvantageInputs, cfg: AdvantageConfig) -> torch.Tensor:
    """Token return-to-go for dense per-token correctness, minus the Σπ² baseline.

    rtg_t = (scored correct tokens at positions ≥ t) / max(1, scored positions ≥ t) and
    A_t = rtg_t − b_t with b_t = Σ_v π(v | prefix)² at scored positions and 0 elsewhere (the
    per-token `expected` baseline; a sequence-level E[r | x] is not used because rtg_t is a
    per-position quantity). Scored positions are ``score_mask_BT``, or ``mask_BT`` when absent.
    Source: the delight-gradient sandbox (``dg_token``). Regime: token tasks with clean,
    decomposable rewards (token_reversal, masked_reversal).
    """
    if x.token_correct_BT is None:
        raise ValueError("advantage 'rtg' needs token_correct_BT (per-token correctness)")
    if x.sum_p2_BT is None:
        raise ValueError("advantage 'rtg' needs sum_p2_BT (the Σπ² baseline)")
    scored_BT = x.mask_BT if x.score_mask_BT is None else x.score_mask_BT
    correct_BT = x.token_correct_BT.to(scored_BT.dtype) * scored_BT
    n_correct_BT = correct_BT.flip(1).cumsum(1).flip(1)
    n_scored_BT = scored_BT.flip(1).cumsum(1).flip(1)
    rtg_BT = n_correct_BT / n_scored_BT.clamp_min(1.0)
    return (rtg_BT - x.sum_p2_BT * scored_BT) * x.mask_BT


def oracle_token(x: AdvantageInputs, cfg: AdvantageConfig) -> torch.Tensor:
    """Per-token oracle advantage A_t = (1[a_t = y_t] − Σ_v π(v | prefix)²)·m_t.

    m_t: scored positions (``score_mask_BT``, or ``mask_BT`` when absent); Σπ² from the current
    learner (detached), the per-token `expected` baseline. Source: the delight-gradient sandbox
    (``self_distill_dg``). Regime: sequence tasks with per-token labels.
    """
    if x.token_correct_BT is None or x.sum_p2_BT is None:
        raise ValueError("advantage 'oracle_token' needs token_correct_BT and sum_p2_BT")
    scored_BT = x.mask_BT if x.score_mask_BT is None else x.score_mask_BT
    correct_BT = x.token_correct_BT.to(scored_BT.dtype)
    return (correct_BT - x.sum_p2_BT) * scored_BT * x.mask_BT


def tempo(x: AdvantageInputs, cfg: AdvantageConfig) -> torch.Tensor:
    """Prefix-tree values within a group: A_{i,t} = ((r_i − mean_g) + V_i(t+1) − V_i(t)) / std_g.

    Row i has n_i = (index of its last valid token) + 1 completion tokens y_i[0..n_i); s_t is
    the state before token t, i.e. the prefix y_i[0..t). V_i(t) = mean reward of the group
    members j with n_j ≥ t and y_j[k] = y_i[k] for every k < t (i is always one of them), so
    V_i(0) = mean_g. After the last token V_i(n_i) = r_i (even if an identical completion in the
    group scored differently). Holes in ``mask_BT`` do not cut the prefix; they only zero A.
    std_g is the population std (clamped from below by ``cfg.std_floor``), A = 0 when
    std_g ≤ 1e-8. The value increments telescope: Σ_t (V_i(t+1) − V_i(t)) = r_i − mean_g.
    Source: TEMPO (prefix-tree values; METHODS.md records no arXiv id). Regime: grouped
    sequence tasks (G > 1) with the completion token ids.
    """
    if x.completion_tokens_BT is None:
        raise ValueError("advantage 'tempo' needs completion_tokens_BT (generated token ids)")
    r_GK = _groups(x.rewards_B, x.group_size)
    G, K = r_GK.shape
    T = x.mask_BT.shape[1]
    idx_T = torch.arange(T, device=x.mask_BT.device)
    len_B = ((x.mask_BT > 0) * (idx_T + 1)).amax(-1)
    valid_GKT = (idx_T < len_B[:, None]).view(G, K, T)
    tok_GKT = x.completion_tokens_BT.reshape(G, K, T)
    same_GKKT = ((tok_GKT[:, :, None] == tok_GKT[:, None]) & valid_GKT[:, :, None]
                 & valid_GKT[:, None])
    share_GKKT = torch.cat([torch.ones_like(same_GKKT[..., :1], dtype=r_GK.dtype),
                            same_GKKT.to(r_GK.dtype).cumprod(-1)], -1)
    value_GKT = ((share_GKKT * r_GK[:, None, :, None]).sum(2)
                 / share_GKKT.sum(2).clamp_min(1.0))
    is_last_GKT = (idx_T == (len_B - 1)[:, None]).view(G, K, T)
    next_GKT = torch.where(is_last_GKT, r_GK[..., None], value_GKT[..., 1:])
    mean_G1 = r_GK.mean(-1, keepdim=True)
    std_G11 = r_GK.std(-1, unbiased=False, keepdim=True)[..., None]
    num_GKT = (r_GK - mean_G1)[..., None] + next_GKT - value_GKT[..., :T]
    adv_GKT = torch.where(std_G11 > EPS, num_GKT / std_G11.clamp_min(cfg.std_floor),
                          torch.zeros_like(num_GKT))
    return adv_GKT.reshape(G * K, T) * x.mask_BT


def maxrl(x: AdvantageInputs, cfg: AdvantageConfig) -> torch.Tensor:
    """A_i = (r_i − mean_g) / (mean_g + 1e-8): mean normalisation instead of std.

    An all-fail group (mean_g = 0) gives A = 0. Source: MaxRL (METHODS.md records no arXiv id).
    Regime: binary {0, 1} rewards with groups (G > 1), no reward noise; with negative rewards
    mean_g can approach 0 from below and A explodes.
    """
    r_GK = _groups(x.rewards_B, x.group_size)
    mean_G1 = r_GK.mean(-1, keepdim=True)
    return _broadcast(((r_GK - mean_G1) / (mean_G1 + EPS)).reshape(-1), x.mask_BT)


def remax(x: AdvantageInputs, cfg: AdvantageConfig) -> torch.Tensor:
    """A = r − r_greedy, the reward of a greedy rollout of the same prompt as the baseline.

    Source: ReMax (Li et al., arXiv:2310.10505). Regime: any task where the loop can roll out
    greedily once per prompt (``greedy_rewards_B``).
    """
    if x.greedy_rewards_B is None:
        raise ValueError("advantage 'remax' needs greedy_rewards_B (a greedy rollout's reward)")
    return _broadcast(x.rewards_B - x.greedy_rewards_B, x.mask_BT)


def passk(x: AdvantageInputs, cfg: AdvantageConfig) -> torch.Tensor:
    """Best-of-group credit: the best sample gets r_max − r_second, every other sample 0.

    r_second is the second-largest reward counting multiplicity, so a tie at the top gives the
    whole group 0 (the first maximiser by index is "the best", with advantage 0). This is the
    METHODS.md form (the gradient of the group max), not the paper's analytic pass@k advantage.
    Source: Pass@k training (Chen et al., arXiv:2508.10751). Regime: grouped (G > 1).
    """
    r_GK = _groups(x.rewards_B, x.group_size)
    if r_GK.shape[1] < 2:
        raise ValueError("advantage 'passk' needs group_size > 1")
    top_G2 = r_GK.topk(2, dim=-1).values
    best_G1 = r_GK.argmax(-1, keepdim=True)
    gap_G1 = top_G2[:, :1] - top_G2[:, 1:]
    adv_GK = torch.zeros_like(r_GK).scatter(1, best_G1, gap_G1)
    return _broadcast(adv_GK.reshape(-1), x.mask_BT)


def _row_lengths_B(mask_BT: torch.Tensor) -> torch.Tensor:
    """|y_i| = Σ_t m_i,t, ``[B]``."""
    return mask_BT.sum(-1)


def opo_baseline_G(x: AdvantageInputs) -> torch.Tensor:
    """b_g = Σ_{i∈g} |y_i| r_i / Σ_{i∈g} |y_i| (the group mean when every length is 0), ``[G]``."""
    r_GK = _groups(x.rewards_B, x.group_size)
    len_GK = _row_lengths_B(x.mask_BT).to(r_GK.dtype).view_as(r_GK)
    total_G = len_GK.sum(-1)
    weighted_G = (len_GK * r_GK).sum(-1) / total_G.clamp_min(EPS)
    return torch.where(total_G > 0, weighted_G, r_GK.mean(-1))


def opo(x: AdvantageInputs, cfg: AdvantageConfig) -> torch.Tensor:
    """A_i = r_i − b_g with the length-weighted baseline b_g = Σ|y_i| r_i / Σ|y_i|; no std.

    The optimal (variance-minimising) baseline of an on-policy sequence gradient whose
    per-sequence gradient norm grows with |y_i|. Equal lengths give `group_center`.
    Source: OPO (Hao et al., arXiv:2505.23585; verl ``opo``). Regime: grouped, exact on-policy
    (one inner epoch of one minibatch, no delay, no replay: the preset requires it).
    """
    r_GK = _groups(x.rewards_B, x.group_size)
    adv_GK = r_GK - opo_baseline_G(x)[:, None]
    return _broadcast(adv_GK.reshape(-1), x.mask_BT)


def gpg_alpha(rewards_B: torch.Tensor, group_size: int) -> torch.Tensor:
    """α = B / (B − M), M the rows in groups with std_g ≤ 1e-8; 0 when M = B (0-d)."""
    std_G = _groups(rewards_B, group_size).std(-1, unbiased=False)
    valid = (std_G > EPS).to(rewards_B.dtype).sum() * group_size
    return torch.where(valid > 0, rewards_B.shape[0] / valid.clamp_min(1.0),
                       torch.zeros_like(valid))


def gpg(x: AdvantageInputs, cfg: AdvantageConfig) -> torch.Tensor:
    """A_i = α (r_i − mean_g) / F: F = 1 (``gpg_std`` off) or std_g + 1e-8; α = B / (B − M).

    M counts the rows of groups with std_g ≤ 1e-8 (a batch statistic); α rescales the
    gradient so zero-variance groups do not dilute it (instead of filtering them); α = 0 when
    every group is flat. Source: GPG (Chu et al., arXiv:2504.02546; AMAP-ML/GPG; verl ``gpg``
    computes α = B / #(rows with r ≠ 0) instead — this follows the paper). Regime: grouped,
    on-policy, one inner epoch, selection ``none``.
    """
    r_GK = _groups(x.rewards_B, x.group_size)
    centred_GK = r_GK - r_GK.mean(-1, keepdim=True)
    if cfg.gpg_std:
        centred_GK = centred_GK / (r_GK.std(-1, unbiased=False, keepdim=True) + EPS)
    adv_GK = gpg_alpha(x.rewards_B, x.group_size) * centred_GK
    return _broadcast(adv_GK.reshape(-1), x.mask_BT)


def centred_batch_std(rewards_B: torch.Tensor, group_size: int) -> torch.Tensor:
    """Population std over the batch's rows of c_i = r_i − mean_g (0-d)."""
    r_GK = _groups(rewards_B, group_size)
    return (r_GK - r_GK.mean(-1, keepdim=True)).std(unbiased=False)


def group_center_batchstd(x: AdvantageInputs, cfg: AdvantageConfig) -> torch.Tensor:
    """A_i = c_i / (std(c) + 1e-8), c_i = r_i − mean_g, std over the rows of the batch.

    The batch is the one selection kept (`mixed_groups` runs first), so the std is over the
    kept rows. A = 0 when std(c) ≤ 1e-8. ``cfg.std_floor`` clamps the std from below. Unlike
    `batch_zscore` (std of the raw rewards, TRL ``scale_rewards="batch"``).
    Source: ScaleRL (Khatri et al., arXiv:2510.13786; centred std as its prime-rl port).
    Regime: grouped batches (G > 1).
    """
    r_GK = _groups(x.rewards_B, x.group_size)
    centred_GK = r_GK - r_GK.mean(-1, keepdim=True)
    std = centred_GK.std(unbiased=False)
    adv_GK = torch.where(std > EPS, centred_GK / (std.clamp_min(cfg.std_floor) + EPS),
                         torch.zeros_like(centred_GK))
    return _broadcast(adv_GK.reshape(-1), x.mask_BT)


def length_lambda_B(mask_BT: torch.Tensor, length_alpha: float, lam: float) -> torch.Tensor:
    """VAPO's per-sequence λ_i = clamp(1 − 1/(α_L |y_i|), 0, 1); α_L = 0 gives ``lam``."""
    len_B = _row_lengths_B(mask_BT)
    if length_alpha == 0:
        return torch.full_like(len_B, lam)
    return (1 - 1 / (length_alpha * len_B).clamp_min(EPS)).clamp(0.0, 1.0)


def gae_decoupled_with_returns(x: AdvantageInputs, cfg: AdvantageConfig
                               ) -> tuple[torch.Tensor, torch.Tensor]:
    """VAPO's decoupled GAE: whitened actor advantages with a length-adaptive λ_i and the
    value targets of a separate λ_critic, ``(adv_BT, returns_BT)``."""
    if x.values_BT is None:
        raise ValueError("advantage 'gae_decoupled' needs values_BT (a value head)")
    rewards_BT = last_token_rewards(x.rewards_B, x.mask_BT)
    if x.token_rewards_BT is not None:
        rewards_BT = rewards_BT + x.token_rewards_BT * x.mask_BT
    lam_B = length_lambda_B(x.mask_BT, cfg.length_alpha, cfg.lam)
    adv_BT, _ = gae_returns(rewards_BT, x.values_BT, x.mask_BT, cfg.gamma, lam_B)
    _, returns_BT = gae_returns(rewards_BT, x.values_BT, x.mask_BT, cfg.gamma, cfg.lam_critic)
    return whiten(adv_BT, x.mask_BT), returns_BT


def gae_decoupled(x: AdvantageInputs, cfg: AdvantageConfig) -> torch.Tensor:
    """GAE whose actor λ_i = clamp(1 − 1/(α_L|y_i|), 0, 1) per sequence (whitened), critic
    targets from GAE with λ_critic (1 with γ = 1: the Monte-Carlo return).

    α_L = 0 uses the fixed ``lam``. The clamp is ours: the paper's λ is negative for
    α_L|y| < 1. Source: VAPO (Yue et al., arXiv:2504.05118). Regime: needs a value head.
    """
    return gae_decoupled_with_returns(x, cfg)[0]
def teacher_rkl(x: AdvantageInputs, cfg: AdvantageConfig) -> torch.Tensor:
    """On-policy distillation: A_t = −β_T (ℓ_μ,t − ℓ_T,t) m_t, the negative sampled-token
    reverse KL to the teacher; with γ_T > 0 its discounted future sum (`discounted_rtg`); plus
    c_env × the advantage of the estimator ``env_advantage`` on the task reward.

    β_T = ``teacher_beta`` (1), γ_T = ``teacher_gamma`` (0), c_env = ``teacher_env_coef`` (0).
    E_{a∼μ}[A_t] = −β_T·KL(μ‖π_T) at s_t; a teacher equal to the behaviour policy gives A ≡ 0.
    The same quantity is the ``teacher_logratio`` advantage of COMPANIONS.md's ``opd_pg``.
    Source: Thinking Machines "On-Policy Distillation" (2025), tinker-cookbook
    ``distillation/train_on_policy.py``. Regime: a teacher of the student's tokenizer.
    """
    if x.teacher_logp_BT is None or x.behaviour_logp_BT is None:
        raise ValueError("advantage 'teacher_rkl' needs teacher_logp_BT and behaviour_logp_BT "
                         "(a teacher: --teacher_path)")
    m_BT = x.mask_BT.to(x.teacher_logp_BT.dtype)
    adv_BT = -cfg.teacher_beta * (x.behaviour_logp_BT - x.teacher_logp_BT) * m_BT
    if cfg.teacher_gamma > 0:
        adv_BT = discounted_rtg(adv_BT, m_BT, cfg.teacher_gamma)
    if cfg.teacher_env_coef != 0:
        adv_BT = adv_BT + cfg.teacher_env_coef * ADVANTAGES[cfg.env_advantage](x, cfg)
    return adv_BT


def teacher_logratio(x: AdvantageInputs, cfg: AdvantageConfig) -> torch.Tensor:
    """OPD's policy-gradient advantage: A_t = sg(log π_T(a_t | s_t) − ℓ_μ,t) m_t, the sampled
    token's log-ratio to a built-in teacher (COMPANIONS.md §1 ``opd_pg``). With one update per
    batch and ``ppo_clip`` this is per-token REINFORCE with γ = 0; it equals ``teacher_rkl``
    with β_T = 1, γ_T = 0, c_env = 0. Regime: a built-in teacher over the task's targets."""
    if x.teacher_logp_BT is None or x.behaviour_logp_BT is None:
        raise ValueError("advantage 'teacher_logratio' needs teacher_logp_BT and "
                         "behaviour_logp_BT (a built-in teacher: --teacher)")
    m_BT = x.mask_BT.to(x.teacher_logp_BT.dtype)
    return (x.teacher_logp_BT - x.behaviour_logp_BT).detach() * m_BT


Estimator = Component[[AdvantageInputs, AdvantageConfig], torch.Tensor]

_CLIP = ("std_floor", "clip")
"""The settings every estimator lists: the |A| clip `compute_advantages` applies after each,
and the std floor of the z-scoring estimators."""

ADVANTAGES: dict[str, Estimator] = {
    "expected": Component(expected, _CLIP, expected_reward_baseline=True),
    "constant": Component(constant, _CLIP),
    "zero": Component(zero, _CLIP),
    "group_zscore": Component(group_zscore, _CLIP, grouped=True),
    "group_center": Component(group_center, _CLIP, grouped=True),
    "rloo": Component(rloo, _CLIP, grouped=True),
    "gae": Component(gae, ("gamma", "lam", *_CLIP), needs_value_head=True),
    "batch_zscore": Component(batch_zscore, _CLIP, grouped=True),
    "reinforce_pp": Component(reinforce_pp, ("gamma", *_CLIP)),
    "reinforce_pp_baseline": Component(reinforce_pp_baseline, ("gamma", *_CLIP), grouped=True),
    "rtg": Component(rtg, _CLIP, needs_learner_probs=True),
    "oracle_token": Component(oracle_token, _CLIP, needs_learner_probs=True),
    "tempo": Component(tempo, _CLIP, grouped=True),
    "maxrl": Component(maxrl, _CLIP, grouped=True),
    "remax": Component(remax, _CLIP, greedy_baseline=True),
    "passk": Component(passk, _CLIP, grouped=True),
    "opo": Component(opo, _CLIP, grouped=True),
    "gpg": Component(gpg, ("gpg_std", "gpg_min_valid", *_CLIP), grouped=True),
    "group_center_batchstd": Component(group_center_batchstd, _CLIP, grouped=True),
    "gae_decoupled": Component(gae_decoupled, ("gamma", "lam", "length_alpha", "lam_critic",
                                               *_CLIP), needs_value_head=True),
    "teacher_rkl": Component(teacher_rkl, ("teacher_beta", "teacher_gamma", "teacher_env_coef",
                                           "env_advantage", *_CLIP), needs_teacher=True),
    "teacher_logratio": Component(teacher_logratio, _CLIP, needs_teacher=True,
                                  builtin_teacher=True),
}

_WITH_RETURNS = {"gae_decoupled": gae_decoupled_with_returns}
"""Value-head estimators whose value targets differ from `gae_with_returns`'s."""


def advantages_with_returns(x: AdvantageInputs, cfg: AdvantageConfig
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """A value-head estimator's advantages and value targets, ``(adv_BT, returns_BT)``."""
    return _WITH_RETURNS.get(cfg.name, gae_with_returns)(x, cfg)


def advantage_extra_metrics(x: AdvantageInputs, cfg: AdvantageConfig
                            ) -> dict[str, torch.Tensor]:
    """The per-estimator ``adv/`` (and ``group/``) metrics of METHODS_2026.md (0-d tensors):
    ``adv/opo_baseline_gap`` = mean_g |b_g − mean_g r|; ``adv/gpg_alpha`` with
    ``group/mixed_rate`` and ``group/fallback`` (1 when α = 0); ``adv/batch_std`` (the
    centred std of `group_center_batchstd`); ``adv/lambda_policy_mean`` (mean λ_i of
    `gae_decoupled`). Empty for the other estimators."""
    if cfg.name == "opo":
        r_GK = _groups(x.rewards_B, x.group_size)
        return {"adv/opo_baseline_gap": (opo_baseline_G(x) - r_GK.mean(-1)).abs().mean()}
    if cfg.name == "gpg":
        alpha = gpg_alpha(x.rewards_B, x.group_size)
        std_G = _groups(x.rewards_B, x.group_size).std(-1, unbiased=False)
        return {"adv/gpg_alpha": alpha, "group/mixed_rate": (std_G > EPS).float().mean(),
                "group/fallback": (alpha == 0).float()}
    if cfg.name == "group_center_batchstd":
        return {"adv/batch_std": centred_batch_std(x.rewards_B, x.group_size)}
    if cfg.name == "gae_decoupled":
        return {"adv/lambda_policy_mean":
                length_lambda_B(x.mask_BT, cfg.length_alpha, cfg.lam).mean()}
    return {}


def compute_advantages(x: AdvantageInputs, cfg: AdvantageConfig) -> torch.Tensor:
    """Run the configured estimator, then the optional |A| clip. Returns ``adv_BT``."""
    adv_BT = ADVANTAGES[cfg.name](x, cfg)
    if cfg.clip > 0:
        adv_BT = adv_BT.clamp(-cfg.clip, cfg.clip)
    return adv_BT
