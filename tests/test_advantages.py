"""Advantage estimators (METHODS.md, "Advantage estimators"): hand-computed values.

The ungrouped batch is 3 sequences × 4 tokens with lengths 4, 2, 3; grouped estimators use
6 sequences in 2 groups of 3 with lengths 4, 2, 3, 4, 1, 3. Every expected value is written out
as scalar arithmetic; masked positions must be exactly 0.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from fp64 import F64
from fp64 import t as _t

from rlscope.methods.advantages import (
    ADVANTAGES,
    EPS,
    AdvantageInputs,
    compute_advantages,
    gae_returns,
    gae_with_returns,
    last_token_rewards,
    whiten,
)
from rlscope.methods.spec import AdvantageConfig

TOL = {"atol": 1e-12, "rtol": 0.0}

MASK_3x4 = torch.tensor([[1.0, 1.0, 1.0, 1.0],
                         [1.0, 1.0, 0.0, 0.0],
                         [1.0, 1.0, 1.0, 0.0]], dtype=F64)
MASK_6x4 = torch.tensor([[1.0, 1.0, 1.0, 1.0],
                         [1.0, 1.0, 0.0, 0.0],
                         [1.0, 1.0, 1.0, 0.0],
                         [1.0, 1.0, 1.0, 1.0],
                         [1.0, 0.0, 0.0, 0.0],
                         [1.0, 1.0, 1.0, 0.0]], dtype=F64)
LENGTHS_6 = (4, 2, 3, 4, 1, 3)


def _rows(values: list[float], lengths: tuple[int, ...], T: int = 4) -> torch.Tensor:
    """Per-sequence scalars broadcast over each row's valid tokens, 0 after."""
    return torch.tensor([[v] * n + [0.0] * (T - n) for v, n in zip(values, lengths, strict=True)],
                        dtype=F64)


# --------------------------------------------------------------------------- expected


def test_expected_uses_exact_expected_reward_when_exposed() -> None:
    x = AdvantageInputs(rewards_B=_t([[1.0, 0.0, 0.5]])[0], mask_BT=MASK_3x4,
                        expected_reward_B=_t([[0.25, 0.5, 0.75]])[0],
                        # Σπ² is ignored when E[r|x] is exposed.
                        sum_p2_BT=torch.full((3, 4), 0.9, dtype=F64))
    adv = ADVANTAGES["expected"](x, AdvantageConfig("expected"))
    want = _t([[1.0 - 0.25] * 4,
               [0.0 - 0.5, 0.0 - 0.5, 0.0, 0.0],
               [0.5 - 0.75, 0.5 - 0.75, 0.5 - 0.75, 0.0]])
    torch.testing.assert_close(adv, want, **TOL)


SUM_P2 = _t([[0.5, 0.6, 0.7, 0.8],
             [0.3, 0.9, 0.2, 0.4],
             [1.0, 0.25, 0.5, 0.1]])
REWARDS_3 = _t([[0.75, 0.5, 0.25]])[0]


def test_expected_sum_p2_baseline_per_token() -> None:
    x = AdvantageInputs(rewards_B=REWARDS_3, mask_BT=MASK_3x4, sum_p2_BT=SUM_P2)
    adv = compute_advantages(x, AdvantageConfig("expected"))
    want = _t([[0.75 - 0.5, 0.75 - 0.6, 0.75 - 0.7, 0.75 - 0.8],
               [0.5 - 0.3, 0.5 - 0.9, 0.0, 0.0],
               [0.25 - 1.0, 0.25 - 0.25, 0.25 - 0.5, 0.0]])
    torch.testing.assert_close(adv, want, **TOL)


def test_expected_keeps_the_baseline_at_unscored_positions() -> None:
    # masked_reversal style: only the last two positions are scored. As in the reference
    # sandbox's _pg_core, b_t = Σπ² at every valid position, scored or not (issue 15: with
    # b_t = 0 there, A_t = r > 0 reinforced whatever was sampled on the unscored prefix).
    score = _t([[0.0, 0.0, 1.0, 1.0]] * 3)
    x = AdvantageInputs(rewards_B=REWARDS_3, mask_BT=MASK_3x4, sum_p2_BT=SUM_P2,
                        score_mask_BT=score)
    adv = compute_advantages(x, AdvantageConfig("expected"))
    want = _t([[0.75 - 0.5, 0.75 - 0.6, 0.75 - 0.7, 0.75 - 0.8],
               [0.5 - 0.3, 0.5 - 0.9, 0.0, 0.0],
               [0.25 - 1.0, 0.25 - 0.25, 0.25 - 0.5, 0.0]])
    torch.testing.assert_close(adv, want, **TOL)
    # rtg still zeroes it off the score mask (the reference's DGToken does too)
    rtg = compute_advantages(dataclasses.replace(x, token_correct_BT=_t([[1.0] * 4] * 3)),
                             AdvantageConfig("rtg"))
    assert bool((rtg[:, :2][MASK_3x4[:, :2] > 0] > 0).all())


def test_expected_without_any_baseline_source_raises() -> None:
    x = AdvantageInputs(rewards_B=REWARDS_3, mask_BT=MASK_3x4)
    with pytest.raises(ValueError, match="sum_p2_BT or expected_reward_B"):
        compute_advantages(x, AdvantageConfig("expected"))


# --------------------------------------------------------------------------- constant, zero


def test_constant_and_zero() -> None:
    x = AdvantageInputs(rewards_B=_t([[1.0, 0.0, 0.25]])[0], mask_BT=MASK_3x4)
    torch.testing.assert_close(compute_advantages(x, AdvantageConfig("constant")),
                               _rows([1.0 - 0.5, 0.0 - 0.5, 0.25 - 0.5], (4, 2, 3)), **TOL)
    torch.testing.assert_close(compute_advantages(x, AdvantageConfig("zero")),
                               _rows([1.0, 0.0, 0.25], (4, 2, 3)), **TOL)


# --------------------------------------------------------------------------- grouped

# Group 0: rewards 2, 0, 1 → mean 1, deviations 1, −1, 0,
#   population std = sqrt((1² + 1² + 0²) / 3) = sqrt(2/3) ≈ 0.8164965809.
# Group 1 (zscore): rewards 0.5, 0.5, 0.5 → std 0 → A = 0 for the whole group.
GROUPED_R = _t([[2.0, 0.0, 1.0, 0.5, 0.5, 0.5]])[0]
STD_G0 = math.sqrt((1.0**2 + 1.0**2 + 0.0**2) / 3)


def _grouped(rewards: torch.Tensor) -> AdvantageInputs:
    return AdvantageInputs(rewards_B=rewards, mask_BT=MASK_6x4, group_size=3)


def test_group_zscore_values_and_zero_std_group() -> None:
    adv = compute_advantages(_grouped(GROUPED_R), AdvantageConfig("group_zscore"))
    d = STD_G0 + 1e-8
    want = _rows([1.0 / d, -1.0 / d, 0.0 / d, 0.0, 0.0, 0.0], LENGTHS_6)
    torch.testing.assert_close(adv, want, **TOL)
    assert abs(1.0 / d - 1.2247448563) < 1e-9  # 1/sqrt(2/3) = sqrt(1.5)


def test_group_zscore_near_zero_std_is_exactly_zero() -> None:
    # deviations ≈ −3e-10, 1.7e-9, −1.3e-9 → std ≈ 1.2e-9 ≤ 1e-8: without the guard A would
    # be ≈ ±0.1 (deviation / (std + 1e-8)); it must be exactly 0.
    rewards = _t([[0.3, 0.3 + 2e-9, 0.3 - 1e-9, 1.0, 0.0, 0.0]])[0]
    adv = compute_advantages(_grouped(rewards), AdvantageConfig("group_zscore"))
    assert torch.equal(adv[:3], torch.zeros(3, 4, dtype=F64))
    assert adv[3, 0] > 0


def test_group_zscore_std_floor() -> None:
    # floor 1.0 > std_g0 ≈ 0.816: the denominator is 1.0 + 1e-8.
    adv = compute_advantages(_grouped(GROUPED_R),
                             AdvantageConfig("group_zscore", std_floor=1.0))
    d = 1.0 + 1e-8
    torch.testing.assert_close(adv, _rows([1.0 / d, -1.0 / d, 0.0, 0.0, 0.0, 0.0], LENGTHS_6),
                               **TOL)
    # floor 0.5 < std_g0: no effect.
    low = compute_advantages(_grouped(GROUPED_R), AdvantageConfig("group_zscore", std_floor=0.5))
    torch.testing.assert_close(low, compute_advantages(_grouped(GROUPED_R),
                                                       AdvantageConfig("group_zscore")), **TOL)
    # A zero-std group stays 0 whatever the floor (the guard reads the raw std).
    assert torch.equal(adv[3:], torch.zeros(3, 4, dtype=F64))


def test_group_center() -> None:
    # Group 1 here: 0.25, 0.75, 0.5 → mean 0.5.
    rewards = _t([[2.0, 0.0, 1.0, 0.25, 0.75, 0.5]])[0]
    adv = compute_advantages(_grouped(rewards), AdvantageConfig("group_center"))
    want = _rows([2.0 - 1.0, 0.0 - 1.0, 1.0 - 1.0, 0.25 - 0.5, 0.75 - 0.5, 0.5 - 0.5],
                 LENGTHS_6)
    torch.testing.assert_close(adv, want, **TOL)


def test_rloo() -> None:
    rewards = _t([[2.0, 0.0, 1.0, 0.25, 0.75, 0.5]])[0]
    adv = compute_advantages(_grouped(rewards), AdvantageConfig("rloo"))
    want = _rows([2.0 - (0.0 + 1.0) / 2, 0.0 - (2.0 + 1.0) / 2, 1.0 - (2.0 + 0.0) / 2,
                  0.25 - (0.75 + 0.5) / 2, 0.75 - (0.25 + 0.5) / 2, 0.5 - (0.25 + 0.75) / 2],
                 LENGTHS_6)
    torch.testing.assert_close(adv, want, **TOL)
    # Identity: RLOO = G/(G−1) × group-centred reward.
    centred = compute_advantages(_grouped(rewards), AdvantageConfig("group_center"))
    torch.testing.assert_close(adv, centred * 3 / 2, **TOL)


def test_rloo_needs_groups_and_groups_must_divide() -> None:
    with pytest.raises(ValueError, match="group_size > 1"):
        compute_advantages(AdvantageInputs(REWARDS_3, MASK_3x4, group_size=1),
                           AdvantageConfig("rloo"))
    with pytest.raises(ValueError, match="do not split into groups of 2"):
        compute_advantages(AdvantageInputs(REWARDS_3, MASK_3x4, group_size=2),
                           AdvantageConfig("group_zscore"))


# --------------------------------------------------------------------------- gae


def test_gae_returns_two_token_hand_example() -> None:
    # γ = λ = 0.5, V = [1, 2], reward 3 on the last token.
    # t=1: δ = 3 + 0.5·0 − 2 = 1,            A_1 = 1
    # t=0: δ = 0 + 0.5·2 − 1 = 0,            A_0 = 0 + 0.5·0.5·1 = 0.25
    # returns = A + V = [1.25, 3]
    adv, ret = gae_returns(_t([[0.0, 3.0]]), _t([[1.0, 2.0]]), _t([[1.0, 1.0]]), 0.5, 0.5)
    torch.testing.assert_close(adv, _t([[0.25, 1.0]]), **TOL)
    torch.testing.assert_close(ret, _t([[1.25, 3.0]]), **TOL)


def _gae_reference(rewards: list[float], values: list[list[float]],
                   token_rewards: list[list[float]], lengths: tuple[int, ...],
                   gamma: float, lam: float) -> tuple[list[list[float]], list[list[float]]]:
    """Plain-Python GAE: reward on the last valid token, V = 0 beyond it; then whitening."""
    raw, rets = [], []
    for r, v, tr, n in zip(rewards, values, token_rewards, lengths, strict=True):
        a = [0.0] * 4
        running = 0.0
        for t in reversed(range(n)):
            r_t = tr[t] + (r if t == n - 1 else 0.0)
            next_v = v[t + 1] if t + 1 < n else 0.0
            delta = r_t + gamma * next_v - v[t]
            running = delta + gamma * lam * running
            a[t] = running
        raw.append(a)
        rets.append([a[t] + v[t] if t < n else 0.0 for t in range(4)])
    valid = [raw[i][t] for i, n in enumerate(lengths) for t in range(n)]
    mean = sum(valid) / len(valid)
    std = math.sqrt(sum((x - mean) ** 2 for x in valid) / len(valid))
    white = [[(raw[i][t] - mean) / (std + 1e-8) if t < n else 0.0 for t in range(4)]
             for i, n in enumerate(lengths)]
    return white, rets


def test_gae_matches_python_loop_with_whitening() -> None:
    gamma, lam = 0.9, 0.8
    rewards = [1.0, -0.5, 0.25]
    values = [[0.1, 0.4, -0.2, 0.3],
              [0.5, -0.1, 7.0, 7.0],   # values past the end must be ignored
              [0.0, 0.2, 0.6, 9.0]]
    token_r = [[-0.01, -0.02, 0.03, -0.04],
               [0.05, 0.01, 5.0, 5.0],  # KL shaping past the end must be ignored
               [-0.03, 0.0, 0.02, 5.0]]
    x = AdvantageInputs(rewards_B=_t([rewards])[0], mask_BT=MASK_3x4, values_BT=_t(values),
                        token_rewards_BT=_t(token_r))
    cfg = AdvantageConfig("gae", gamma=gamma, lam=lam)
    adv, ret = gae_with_returns(x, cfg)
    want_adv, want_ret = _gae_reference(rewards, values, token_r, (4, 2, 3), gamma, lam)
    torch.testing.assert_close(adv, _t(want_adv), **TOL)
    torch.testing.assert_close(ret, _t(want_ret), **TOL)
    torch.testing.assert_close(compute_advantages(x, cfg), adv, **TOL)
    # Whitened over the 9 valid tokens: mean 0, population std 1 (up to the 1e-8 guard).
    valid = adv[MASK_3x4.bool()]
    assert abs(float(valid.mean())) < 1e-12
    assert abs(float(valid.std(unbiased=False)) - 1.0) < 1e-7


def test_gae_needs_values() -> None:
    with pytest.raises(ValueError, match="value head"):
        compute_advantages(AdvantageInputs(REWARDS_3, MASK_3x4), AdvantageConfig("gae"))


def test_last_token_rewards_and_whiten() -> None:
    torch.testing.assert_close(last_token_rewards(_t([[1.0, 2.0, 3.0]])[0], MASK_3x4),
                               _t([[0.0, 0.0, 0.0, 1.0],
                                   [0.0, 2.0, 0.0, 0.0],
                                   [0.0, 0.0, 3.0, 0.0]]), **TOL)
    # Valid entries 1, 3 (mask drops the 100): mean 2, population std 1.
    out = whiten(_t([[1.0, 3.0, 100.0]]), _t([[1.0, 1.0, 0.0]]))
    torch.testing.assert_close(out, _t([[(1.0 - 2.0) / (1.0 + EPS), (3.0 - 2.0) / (1.0 + EPS),
                                         0.0]]), **TOL)


# --------------------------------------------------------------------------- adv clip


def test_adv_clip_clamps_magnitude() -> None:
    rewards = _t([[2.0, 0.0, 1.0, 0.25, 0.75, 0.5]])[0]
    adv = compute_advantages(_grouped(rewards), AdvantageConfig("group_center", clip=0.5))
    # centred: 1, −1, 0, −0.25, 0.25, 0 → clamp to [−0.5, 0.5]
    want = _rows([0.5, -0.5, 0.0, -0.25, 0.25, 0.0], LENGTHS_6)
    torch.testing.assert_close(adv, want, **TOL)
    unclipped = compute_advantages(_grouped(rewards), AdvantageConfig("group_center", clip=0.0))
    assert float(unclipped.abs().max()) == 1.0


# --------------------------------------------------------------------------- batch_zscore


def test_batch_zscore_group_mean_over_batch_std() -> None:
    # rewards 2, 0, 1 | 0.25, 0.75, 0.5: group means 1 and 0.5.
    # Batch mean = 4.5 / 6 = 0.75; squared deviations from it:
    #   1.5625, 0.5625, 0.0625, 0.25, 0, 0.0625 → sum 2.5, population var 2.5 / 6.
    rewards = _t([[2.0, 0.0, 1.0, 0.25, 0.75, 0.5]])[0]
    adv = compute_advantages(_grouped(rewards), AdvantageConfig("batch_zscore"))
    d = math.sqrt(2.5 / 6) + 1e-8
    want = _rows([(2.0 - 1.0) / d, (0.0 - 1.0) / d, (1.0 - 1.0) / d,
                  (0.25 - 0.5) / d, (0.75 - 0.5) / d, (0.5 - 0.5) / d], LENGTHS_6)
    torch.testing.assert_close(adv, want, **TOL)


def test_batch_zscore_uniform_group_stays_zero_and_constant_batch_is_zero() -> None:
    # Group 1 is uniform (0.5 × 3): centred 0 whatever the batch std.
    adv = compute_advantages(_grouped(GROUPED_R), AdvantageConfig("batch_zscore"))
    assert torch.equal(adv[3:], torch.zeros(3, 4, dtype=F64))
    # batch mean 4.5/6 = 0.75; var = (1.25² + 0.75² + 0.25² + 3·0.25²) / 6
    var = (1.25**2 + 0.75**2 + 0.25**2 + 3 * 0.25**2) / 6
    torch.testing.assert_close(adv[0, 0], torch.tensor(1.0 / (math.sqrt(var) + 1e-8),
                                                       dtype=F64), **TOL)
    flat = compute_advantages(_grouped(torch.full((6,), 0.3, dtype=F64)),
                              AdvantageConfig("batch_zscore"))
    assert torch.equal(flat, torch.zeros(6, 4, dtype=F64))


# --------------------------------------------------------------------------- reinforce_pp


def _whiten_rows(raw: list[list[float]], lengths: tuple[int, ...]) -> torch.Tensor:
    valid = [raw[i][t] for i, n in enumerate(lengths) for t in range(n)]
    mean = sum(valid) / len(valid)
    std = math.sqrt(sum((v - mean) ** 2 for v in valid) / len(valid))
    return _t([[(raw[i][t] - mean) / (std + 1e-8) if t < n else 0.0 for t in range(4)]
               for i, n in enumerate(lengths)])


def test_reinforce_pp_discounted_return_to_go_then_whiten() -> None:
    # γ = 0.5, rewards 1, −0.5, 0.25 on the last valid token (lengths 4, 2, 3), plus KL shaping.
    # row 0: per-token r = [0.1, 0, −0.2, 0.3 + 1]          → G_3 = 1.3,
    #        G_2 = −0.2 + 0.5·1.3 = 0.45, G_1 = 0 + 0.5·0.45 = 0.225, G_0 = 0.1 + 0.5·0.225
    # row 1: per-token r = [0, 0.2 − 0.5] (shaping past the end ignored)
    #        G_1 = −0.3, G_0 = 0 + 0.5·(−0.3) = −0.15
    # row 2: per-token r = [0, 0, 0.25] → G = [0.0625, 0.125, 0.25]
    token_r = _t([[0.1, 0.0, -0.2, 0.3],
                  [0.0, 0.2, 9.0, 9.0],
                  [0.0, 0.0, 0.0, 9.0]])
    x = AdvantageInputs(rewards_B=_t([[1.0, -0.5, 0.25]])[0], mask_BT=MASK_3x4,
                        token_rewards_BT=token_r)
    adv = compute_advantages(x, AdvantageConfig("reinforce_pp", gamma=0.5))
    raw = [[0.1 + 0.5 * 0.225, 0.225, 0.45, 1.3],
           [-0.15, -0.3, 0.0, 0.0],
           [0.0625, 0.125, 0.25, 0.0]]
    torch.testing.assert_close(adv, _whiten_rows(raw, (4, 2, 3)), **TOL)


def test_reinforce_pp_gamma_one_is_whitened_reward_on_every_token() -> None:
    # γ = 1, no shaping: G_t = r on every valid token. Valid values: 1×4, 0×2, 0.5×3 →
    # mean = (4 + 1.5) / 9, then whiten.
    x = AdvantageInputs(rewards_B=_t([[1.0, 0.0, 0.5]])[0], mask_BT=MASK_3x4)
    adv = compute_advantages(x, AdvantageConfig("reinforce_pp", gamma=1.0))
    raw = [[1.0] * 4, [0.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.5, 0.0]]
    torch.testing.assert_close(adv, _whiten_rows(raw, (4, 2, 3)), **TOL)


def test_reinforce_pp_baseline_subtracts_group_mean_first() -> None:
    # Group means 1 and 0.5 → centred rewards 1, −1, 0, −0.25, 0.25, 0; γ = 1 so G_t = the
    # centred reward on each valid token (lengths 4, 2, 3, 4, 1, 3); then whiten over 17 tokens.
    rewards = _t([[2.0, 0.0, 1.0, 0.25, 0.75, 0.5]])[0]
    adv = compute_advantages(_grouped(rewards), AdvantageConfig("reinforce_pp_baseline"))
    centred = [1.0, -1.0, 0.0, -0.25, 0.25, 0.0]
    raw = [[c] * 4 for c in centred]
    torch.testing.assert_close(adv, _whiten_rows(raw, LENGTHS_6), **TOL)


# --------------------------------------------------------------------------- rtg


def test_rtg_fraction_of_correct_scored_suffix_minus_sum_p2() -> None:
    # No score mask: scored = loss mask. correct:
    #   row 0: 1 0 1 1 → suffix correct 3 2 2 1 over 4 3 2 1 scored
    #   row 1: 0 1 | (1 1 past the end, ignored) → 1 1 over 2 1
    #   row 2: 1 1 0 | → 2 1 0 over 3 2 1
    correct = _t([[1.0, 0.0, 1.0, 1.0], [0.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 1.0]])
    x = AdvantageInputs(rewards_B=REWARDS_3, mask_BT=MASK_3x4, sum_p2_BT=SUM_P2,
                        token_correct_BT=correct)
    adv = compute_advantages(x, AdvantageConfig("rtg"))
    want = _t([[3 / 4 - 0.5, 2 / 3 - 0.6, 2 / 2 - 0.7, 1 / 1 - 0.8],
               [1 / 2 - 0.3, 1 / 1 - 0.9, 0.0, 0.0],
               [2 / 3 - 1.0, 1 / 2 - 0.25, 0 / 1 - 0.5, 0.0]])
    torch.testing.assert_close(adv, want, **TOL)


def test_rtg_score_mask_counts_only_scored_positions_and_zeroes_baseline() -> None:
    # Only positions 2, 3 scored. row 0 correct at 2, 3 wrong: suffix (correct, scored) =
    # t0 (1, 2), t1 (1, 2), t2 (1, 2), t3 (0, 1). row 1 has no scored valid position:
    # rtg = 0 / max(1, 0) = 0 and b = 0. row 2: correct at 2 → (1,1) at t0..t2.
    score = _t([[0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]])
    correct = _t([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]])
    x = AdvantageInputs(rewards_B=REWARDS_3, mask_BT=MASK_3x4, sum_p2_BT=SUM_P2,
                        score_mask_BT=score, token_correct_BT=correct)
    adv = compute_advantages(x, AdvantageConfig("rtg"))
    want = _t([[1 / 2 - 0.0, 1 / 2 - 0.0, 1 / 2 - 0.7, 0 / 1 - 0.8],
               [0.0, 0.0, 0.0, 0.0],
               [1 / 1 - 0.0, 1 / 1 - 0.0, 1 / 1 - 0.5, 0.0]])
    torch.testing.assert_close(adv, want, **TOL)


def test_rtg_missing_inputs_raise() -> None:
    with pytest.raises(ValueError, match="token_correct_BT"):
        compute_advantages(AdvantageInputs(REWARDS_3, MASK_3x4, sum_p2_BT=SUM_P2),
                           AdvantageConfig("rtg"))
    with pytest.raises(ValueError, match="sum_p2_BT"):
        compute_advantages(AdvantageInputs(REWARDS_3, MASK_3x4,
                                           token_correct_BT=torch.ones(3, 4, dtype=F64)),
                           AdvantageConfig("rtg"))


# --------------------------------------------------------------------------- tempo


def test_tempo_prefix_tree_values() -> None:
    # One group of 4, lengths 3, 3, 2, 4. Tokens (−1 = padding):
    #   a: 5 6 7 | r = 1      b: 5 6 8 | r = 0      c: 5 9 | r = 1      d: 4 4 4 4 | r = 0
    # mean_g = 0.5, std_g = 0.5.  V(s_0) = 0.5 for everyone.
    # a, b share "5 6": V_a(1) = V_a(2) = mean(a, b, c after "5") → V(1) = (1+0+1)/3 = 2/3,
    #   V(2) (prefix "5 6") = (1+0)/2 = 1/2, V(3) = r (last token).
    # c: V(1) = 2/3, V(2) = r_c = 1.   d: V(1..3) = 0 (alone), V(4) = r_d = 0.
    tokens = torch.tensor([[5, 6, 7, -1], [5, 6, 8, -1], [5, 9, -1, -1], [4, 4, 4, 4]])
    mask = _t([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0],
               [1.0, 1.0, 1.0, 1.0]])
    x = AdvantageInputs(rewards_B=_t([[1.0, 0.0, 1.0, 0.0]])[0], mask_BT=mask, group_size=4,
                        completion_tokens_BT=tokens)
    adv = compute_advantages(x, AdvantageConfig("tempo"))
    s = 0.5
    want = _t([[(0.5 + 2 / 3 - 0.5) / s, (0.5 + 0.5 - 2 / 3) / s, (0.5 + 1.0 - 0.5) / s, 0.0],
               [(-0.5 + 2 / 3 - 0.5) / s, (-0.5 + 0.5 - 2 / 3) / s, (-0.5 + 0.0 - 0.5) / s,
                0.0],
               [(0.5 + 2 / 3 - 0.5) / s, (0.5 + 1.0 - 2 / 3) / s, 0.0, 0.0],
               [(-0.5 + 0.0 - 0.5) / s, (-0.5 + 0.0 - 0.0) / s, (-0.5 + 0.0 - 0.0) / s,
                (-0.5 + 0.0 - 0.0) / s]])
    torch.testing.assert_close(adv, want, **TOL)
    # Telescoping: Σ_t (V(t+1) − V(t)) = r_i − mean_g, so row sums are (n_i + 1)(r_i − mean)/σ.
    torch.testing.assert_close(adv.sum(1), _t([[4 * 1.0, 4 * -1.0, 3 * 1.0, 5 * -1.0]])[0],
                               **TOL)


def test_tempo_uniform_group_is_zero_and_needs_tokens() -> None:
    tokens = torch.tensor([[1, 2, 3, 4]] * 6)
    x = AdvantageInputs(rewards_B=GROUPED_R, mask_BT=MASK_6x4, group_size=3,
                        completion_tokens_BT=tokens)
    adv = compute_advantages(x, AdvantageConfig("tempo"))
    assert torch.equal(adv[3:], torch.zeros(3, 4, dtype=F64))
    with pytest.raises(ValueError, match="completion_tokens_BT"):
        compute_advantages(_grouped(GROUPED_R), AdvantageConfig("tempo"))


# --------------------------------------------------------------------------- maxrl


def test_maxrl_mean_normalised() -> None:
    # Group 0: 1, 0, 1 → mean 2/3. Group 1: 0, 0, 0 → mean 0 → A = 0 / 1e-8 = 0.
    rewards = _t([[1.0, 0.0, 1.0, 0.0, 0.0, 0.0]])[0]
    adv = compute_advantages(_grouped(rewards), AdvantageConfig("maxrl"))
    m = 2 / 3
    want = _rows([(1.0 - m) / (m + 1e-8), (0.0 - m) / (m + 1e-8), (1.0 - m) / (m + 1e-8),
                  0.0, 0.0, 0.0], LENGTHS_6)
    torch.testing.assert_close(adv, want, **TOL)


# --------------------------------------------------------------------------- remax


def test_remax_greedy_baseline_and_missing_input() -> None:
    x = AdvantageInputs(rewards_B=_t([[1.0, 0.0, 0.25]])[0], mask_BT=MASK_3x4,
                        greedy_rewards_B=_t([[0.5, 0.5, 1.0]])[0])
    adv = compute_advantages(x, AdvantageConfig("remax"))
    torch.testing.assert_close(adv, _rows([1.0 - 0.5, 0.0 - 0.5, 0.25 - 1.0], (4, 2, 3)),
                               **TOL)
    with pytest.raises(ValueError, match="greedy_rewards_B"):
        compute_advantages(AdvantageInputs(REWARDS_3, MASK_3x4), AdvantageConfig("remax"))


# --------------------------------------------------------------------------- passk


def test_passk_only_best_gets_gap_to_second() -> None:
    # Group 0: 2, 0, 1 → best row 0 gets 2 − 1. Group 1: 0.25, 0.75, 0.5 → row 4 gets 0.75 − 0.5.
    rewards = _t([[2.0, 0.0, 1.0, 0.25, 0.75, 0.5]])[0]
    adv = compute_advantages(_grouped(rewards), AdvantageConfig("passk"))
    torch.testing.assert_close(adv, _rows([2.0 - 1.0, 0.0, 0.0, 0.0, 0.75 - 0.5, 0.0],
                                          LENGTHS_6), **TOL)


def test_passk_tie_at_the_top_gives_zero() -> None:
    # Group 0: 1, 0, 1 → r_max = r_second = 1 → all 0. Group 1: 0.5 × 3 → all 0.
    rewards = _t([[1.0, 0.0, 1.0, 0.5, 0.5, 0.5]])[0]
    adv = compute_advantages(_grouped(rewards), AdvantageConfig("passk"))
    assert torch.equal(adv, torch.zeros(6, 4, dtype=F64))
    with pytest.raises(ValueError, match="group_size > 1"):
        compute_advantages(AdvantageInputs(REWARDS_3, MASK_3x4), AdvantageConfig("passk"))
