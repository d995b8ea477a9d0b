"""Gates and per-token objectives (METHODS.md, "Gates and weights", "Objectives").

Hand-computed values on small tensors; the log-ratio ℓ − ℓ_μ is chosen as log ρ for the ratios
ρ we want, so every expected number is written from ρ and A.
"""

from __future__ import annotations

import math

import pytest
import torch
from fp64 import F64, TOL
from fp64 import t as _t

from rlscope.methods.gates import GATES, GateInputs
from rlscope.methods.objectives import OBJECTIVES, PolicyTerms, ratio
from rlscope.methods.spec import GateConfig, ObjectiveConfig


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _terms(logp: torch.Tensor, log_rho: list[list[float]], adv: list[list[float]]
           ) -> PolicyTerms:
    """Terms with ℓ_μ = ℓ − log ρ (so ratio = ρ) and weight = A; mask all ones."""
    return PolicyTerms(logp_BT=logp, logp_old_BT=logp.detach() - _t(log_rho),
                       weight_BT=_t(adv), mask_BT=torch.ones_like(logp))


# --------------------------------------------------------------------------- gates


def test_gate_none_passes_the_advantage() -> None:
    adv = _t([[1.0, -2.0, 0.0]])
    w, stats = GATES["none"](GateInputs(adv, _t([[-0.1, -1.0, -3.0]])), GateConfig("none"))
    assert torch.equal(w, adv)
    assert stats == {}


def test_gate_delight_values() -> None:
    # g = σ(A · (−ℓ) / η), w = g · A, η = 2.
    adv = _t([[2.0, -2.0, 1.0, 0.0]])
    logp = _t([[-1.0, -1.0, -0.5, -4.0]])
    w, stats = GATES["delight"](GateInputs(adv, logp), GateConfig("delight", eta=2.0))
    g = [_sigmoid(2.0 * 1.0 / 2.0),    # surprising success: σ(1) ≈ 0.731
         _sigmoid(-2.0 * 1.0 / 2.0),   # surprising failure damped: σ(−1) ≈ 0.269
         _sigmoid(1.0 * 0.5 / 2.0),    # σ(0.25)
         _sigmoid(0.0)]                # A = 0 → g = 1/2, w = 0
    torch.testing.assert_close(stats["gate_mean"], _t([g]), **TOL)
    torch.testing.assert_close(w, _t([[g[0] * 2.0, g[1] * -2.0, g[2] * 1.0, 0.0]]), **TOL)
    assert abs(g[0] - 0.7310585786300049) < 1e-15


def test_gate_delight_temperature() -> None:
    # Larger η flattens the gate towards 1/2: σ(1/10) for η = 10.
    _, stats = GATES["delight"](GateInputs(_t([[2.0]]), _t([[-0.5]])),
                                GateConfig("delight", eta=10.0))
    torch.testing.assert_close(stats["gate_mean"], _t([[_sigmoid(2.0 * 0.5 / 10.0)]]), **TOL)


# --------------------------------------------------------------------------- score


def test_score_loss_and_gradient_only_through_logp() -> None:
    logp = _t([[-0.5, -1.0, -2.0]]).requires_grad_()
    weight = _t([[1.0, -0.5, 2.0]]).requires_grad_()
    loss, stats = OBJECTIVES["score"](
        PolicyTerms(logp, logp.detach(), weight, torch.ones(1, 3, dtype=F64)),
        ObjectiveConfig("score"))
    # loss = −ℓ · w per token: 0.5 · 1, 1 · (−0.5), 2 · 2.
    torch.testing.assert_close(loss, _t([[0.5 * 1.0, 1.0 * -0.5, 2.0 * 2.0]]), **TOL)
    assert stats == {}
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, _t([[-1.0, 0.5, -2.0]]), **TOL)
    assert weight.grad is None  # sg(w)


# --------------------------------------------------------------------------- is_capped


def test_is_capped_cap_binds() -> None:
    # ρ = 0.5, 2, 20 (> cap 10 → 10), 1; A = 1, −1, 0.5, 2.
    logp = _t([[-0.2, -0.4, -0.6, -0.8]]).requires_grad_()
    x = _terms(logp, [[math.log(0.5), math.log(2.0), math.log(20.0), 0.0]],
               [[1.0, -1.0, 0.5, 2.0]])
    loss, stats = OBJECTIVES["is_capped"](x, ObjectiveConfig("is_capped", cap=10.0))
    iw = [0.5, 2.0, 10.0, 1.0]
    torch.testing.assert_close(stats["iw_mean"], _t([iw]), **TOL)
    torch.testing.assert_close(
        loss, _t([[0.2 * 1.0 * 0.5, 0.4 * -1.0 * 2.0, 0.6 * 0.5 * 10.0, 0.8 * 2.0 * 1.0]]), **TOL)
    loss.sum().backward()
    # Score form: no gradient through ρ, d loss / dℓ = −w · min(ρ, cap).
    torch.testing.assert_close(logp.grad, _t([[-0.5, 2.0, -5.0, -2.0]]), **TOL)


def test_ratio_log_clamp() -> None:
    # ρ = exp(clamp(ℓ − ℓ_μ, −20, 20)).
    r = ratio(_t([[30.0, -30.0, 0.5]]), _t([[0.0, 0.0, 0.0]]))
    torch.testing.assert_close(r, _t([[math.exp(20.0), math.exp(-20.0), math.exp(0.5)]]),
                               **TOL)


# --------------------------------------------------------------------------- ppo_clip

# ε_low = 0.2, ε_high = 0.28 (asymmetric so a swap shows). Token by token:
#   ρ     A    unclipped ρA   clipped clip(ρ,0.8,1.28)·A   loss = −min    flags
#   0.5  −1     −0.5            −0.8                        0.8           low
#   0.5  +1      0.5             0.8                       −0.5           —
#   1.5  +1      1.5             1.28                      −1.28          high
#   1.5  −1     −1.5            −1.28                       1.5           —
#   1.1  +2      2.2             2.2                       −2.2           —
#   0.9  −2     −1.8            −1.8                        1.8           —
#   1.25 +1      1.25            1.25                      −1.25          — (clipped if ε_high 0.2)
#   0.75 −1     −0.75           −0.8                        0.8           low
PPO_RHO = [[0.5, 0.5, 1.5, 1.5], [1.1, 0.9, 1.25, 0.75]]
PPO_ADV = [[-1.0, 1.0, 1.0, -1.0], [2.0, -2.0, 1.0, -1.0]]
PPO_CFG = ObjectiveConfig("ppo_clip", clip_low=0.2, clip_high=0.28)


def _ppo(cfg: ObjectiveConfig = PPO_CFG, rho: list[list[float]] = PPO_RHO,
         adv: list[list[float]] = PPO_ADV
         ) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
    logp = torch.full((len(rho), len(rho[0])), -1.0, dtype=F64, requires_grad=True)
    x = _terms(logp, [[math.log(r) for r in row] for row in rho], adv)
    loss, stats = OBJECTIVES["ppo_clip"](x, cfg)
    loss.sum().backward()
    assert logp.grad is not None
    return loss, stats, logp.grad


def test_ppo_clip_loss_values() -> None:
    loss, _, _ = _ppo()
    torch.testing.assert_close(loss, _t([[0.8, -0.5, -1.28, 1.5],
                                         [-2.2, 1.8, -1.25, 0.8]]), **TOL)


def test_ppo_clip_fractions_exact() -> None:
    _, stats, _ = _ppo()
    assert torch.equal(stats["clipfrac_low"], _t([[1, 0, 0, 0], [0, 0, 0, 1]]).float())
    assert torch.equal(stats["clipfrac_high"], _t([[0, 0, 1, 0], [0, 0, 0, 0]]).float())
    assert torch.equal(stats["clipfrac_region"], _t([[1, 0, 1, 0], [0, 0, 0, 1]]).float())
    assert "clipfrac_dual" not in stats


def test_ppo_clip_gradient_through_ratio() -> None:
    # d(−ρA)/dℓ = −ρA where unclipped (dρ/dℓ = ρ); 0 where the clip binds.
    _, _, grad = _ppo()
    torch.testing.assert_close(grad, _t([[0.0, -0.5 * 1.0, 0.0, -1.5 * -1.0],
                                         [-1.1 * 2.0, -0.9 * -2.0, -1.25 * 1.0, 0.0]]), **TOL)


def test_ppo_clip_symmetric_epsilon_clips_1_25() -> None:
    # With ε_high = 0.2 the ρ = 1.25, A = +1 token is clipped at 1.2: loss −1.2, flag high.
    loss, stats, _ = _ppo(ObjectiveConfig("ppo_clip", clip_low=0.2, clip_high=0.2))
    assert abs(float(loss.detach()[1, 2]) - -1.2) < 1e-12
    assert float(stats["clipfrac_high"][1, 2]) == 1.0


def test_ppo_dual_clip_caps_negative_advantage_loss() -> None:
    # c = 3: for A < 0 the loss is capped at −c·A = 3|A|.
    #   ρ = 5,   A = −1: standard −min(−5, −1.28) = 5 → capped to 3, dual flag, zero grad.
    #   ρ = 1.5, A = −1: 1.5 < 3, unchanged, gradient −ρA = 1.5.
    #   ρ = 5,   A = +1: A > 0 → unaffected: −min(5, 1.28) = −1.28 (high clip).
    #   ρ = 4,   A = −0.5: standard −min(−2, −0.64) = 2 > −c·A = 1.5 → capped to 1.5.
    cfg = ObjectiveConfig("ppo_clip", clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    loss, stats, grad = _ppo(cfg, [[5.0, 1.5, 5.0, 4.0]], [[-1.0, -1.0, 1.0, -0.5]])
    torch.testing.assert_close(loss, _t([[3.0, 1.5, -1.28, 1.5]]), **TOL)
    assert torch.equal(stats["clipfrac_dual"], _t([[1, 0, 0, 1]]).float())
    torch.testing.assert_close(grad, _t([[0.0, 1.5, 0.0, 0.0]]), **TOL)


# --------------------------------------------------------------------------- ce_oracle


def test_ce_oracle_is_negative_logp() -> None:
    logp = _t([[-0.1, -2.0, -0.7]]).requires_grad_()
    loss, stats = OBJECTIVES["ce_oracle"](
        PolicyTerms(logp, logp.detach() - 5.0, _t([[9.0, 9.0, 9.0]]), torch.ones(1, 3)),
        ObjectiveConfig("ce_oracle"))
    torch.testing.assert_close(loss, _t([[0.1, 2.0, 0.7]]), **TOL)
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, _t([[-1.0, -1.0, -1.0]]), **TOL)
    assert stats == {}


@pytest.mark.parametrize("name", ["score", "is_capped", "ppo_clip"])
def test_on_policy_objectives_start_at_minus_advantage_slope(name: str) -> None:
    # On-policy (ρ = 1) every RL objective has d loss / dℓ = −A.
    logp = _t([[-0.3, -1.2, -2.5]]).requires_grad_()
    adv = _t([[1.5, -0.5, 0.25]])
    loss, _ = OBJECTIVES[name](PolicyTerms(logp, logp.detach(), adv, torch.ones(1, 3)),
                               ObjectiveConfig(name))
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, -adv, atol=1e-15, rtol=0.0)


# --------------------------------------------------------------------------- new objectives
# Ragged batches: ℓ_μ = ℓ − log ρ per token; masked tokens carry deliberately large log-ratios
# so any leak of the mask into sequence-level quantities shows.


def _mterms(logp: torch.Tensor, log_rho: list[list[float]], adv: list[list[float]],
            mask: list[list[float]], **extra: torch.Tensor) -> PolicyTerms:
    return PolicyTerms(logp_BT=logp, logp_old_BT=logp.detach() - _t(log_rho),
                       weight_BT=_t(adv), mask_BT=_t(mask), **extra)


def _masked_sum_grad(loss: torch.Tensor, x: PolicyTerms, logp: torch.Tensor) -> torch.Tensor:
    """Gradient of Σ_t m_t loss_t (the `sum` aggregation) w.r.t. ℓ."""
    (loss * x.mask_BT).sum().backward()
    assert logp.grad is not None
    return logp.grad


L = math.log


def test_traj_is_capped_sequence_ratio_values_and_score_gradient() -> None:
    # Row 0: ρ_seq = 2·3 = 6 (masked ρ = 100 ignored). Row 1: 4·5·1 = 20 → cap 10.
    logp = _t([[-0.5, -1.0, -2.0], [-0.25, -0.75, -1.5]]).requires_grad_()
    x = _mterms(logp, [[L(2.0), L(3.0), L(100.0)], [L(4.0), L(5.0), 0.0]],
                [[1.0, -0.5, 7.0], [0.5, 0.5, 2.0]], [[1, 1, 0], [1, 1, 1]])
    loss, stats = OBJECTIVES["traj_is_capped"](x, ObjectiveConfig("traj_is_capped", cap=10.0))
    torch.testing.assert_close(stats["iw_mean"], _t([[6.0] * 3, [10.0] * 3]), **TOL)
    torch.testing.assert_close(loss, _t([[0.5 * 1.0 * 6, 1.0 * -0.5 * 6, 2.0 * 7.0 * 6],
                                         [0.25 * 0.5 * 10, 0.75 * 0.5 * 10, 1.5 * 2.0 * 10]]),
                               **TOL)
    grad = _masked_sum_grad(loss, x, logp)  # score form: −A · iw on valid tokens only
    torch.testing.assert_close(grad, _t([[-6.0, 3.0, 0.0], [-5.0, -5.0, -20.0]]), **TOL)


GSPO_CFG = ObjectiveConfig("gspo", clip_low=0.2, clip_high=0.28)


def _gspo() -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
    # Row 0: s = exp((L1.1 + L1.1)/2) = 1.1 (masked ρ = 50 ignored), A = 1, 3: unclipped.
    # Row 1: s = exp(L8/3) = 2, A = −1: A < 0 is not clipped from above → loss 2 per token.
    # Row 2: one valid token, s = 0.25, A = −1: clipped low → loss 0.8, no gradient.
    logp = torch.full((3, 3), -1.0, dtype=F64, requires_grad=True)
    x = _mterms(logp, [[L(1.1), L(1.1), L(50.0)], [L(8.0), 0.0, 0.0], [L(0.25), 3.0, 3.0]],
                [[1.0, 3.0, 1.0], [-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]],
                [[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    loss, stats = OBJECTIVES["gspo"](x, GSPO_CFG)
    return loss, stats, _masked_sum_grad(loss, x, logp)


def test_gspo_sequence_ratio_loss_values_and_clip_flags() -> None:
    loss, stats, _ = _gspo()
    masked = loss.detach() * _t([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    torch.testing.assert_close(masked, _t([[-1.1, -3.3, 0.0], [2.0, 2.0, 2.0],
                                           [0.8, 0.0, 0.0]]), **TOL)
    assert torch.equal(stats["clipfrac_low"][:, 0], torch.tensor([0.0, 0.0, 1.0]))
    assert float(stats["clipfrac_high"].sum()) == 0.0


def test_gspo_gradient_flows_to_every_token_of_the_sequence() -> None:
    # d Σ_t m_t loss_t / dℓ_k = −m_k · s_i · (Σ_t m_t A_t) / |y_i| where unclipped:
    #   row 0: −1.1 · (1 + 3) / 2 = −2.2 on both valid tokens (not −1.1, −3.3 per token);
    #   row 1: −2 · (−3) / 3 = 2; row 2: clipped → 0.
    _, _, grad = _gspo()
    torch.testing.assert_close(grad, _t([[-2.2, -2.2, 0.0], [2.0, 2.0, 2.0],
                                         [0.0, 0.0, 0.0]]), **TOL)


def test_cispo_capped_detached_weight() -> None:
    # ρ = 0.5, 2, 8 → 5 | 6 → 5, 1, (masked). Loss −ℓ · min(ρ, 5) · A; gradient −min(ρ, 5) · A.
    logp = _t([[-1.0, -2.0, -0.5], [-0.1, -0.3, -9.0]]).requires_grad_()
    x = _mterms(logp, [[L(0.5), L(2.0), L(8.0)], [L(6.0), 0.0, 0.0]],
                [[1.0, -1.0, 0.5], [2.0, -3.0, 1.0]], [[1, 1, 1], [1, 1, 0]])
    loss, stats = OBJECTIVES["cispo"](x, ObjectiveConfig("cispo", cispo_max=5.0))
    iw = _t([[0.5, 2.0, 5.0], [5.0, 1.0, 1.0]])
    torch.testing.assert_close(stats["iw_mean"], iw, **TOL)
    assert torch.equal(stats["cispo_capped_frac"], torch.tensor([[0.0, 0.0, 1.0], [1.0, 0, 0]]))
    torch.testing.assert_close(loss, _t([[1.0 * 0.5, 2.0 * -2.0, 0.5 * 2.5],
                                         [0.1 * 10.0, 0.3 * -3.0, 9.0 * 1.0]]), **TOL)
    grad = _masked_sum_grad(loss, x, logp)
    # Capped tokens still get gradient (−5 · A): CISPO never zeroes a token.
    torch.testing.assert_close(grad, _t([[-0.5, 2.0, -2.5], [-10.0, 3.0, 0.0]]), **TOL)


def test_aspo_asymmetric_weights() -> None:
    # ε_low 0.2, ε_high 0.28.  A > 0: w = min(1/ρ, 1.28); A ≤ 0: w = max(ρ, 0.8).
    #   ρ 0.5, A +1: 1/ρ = 2 → 1.28   | ρ 2, A +1: 0.5
    #   ρ 0.5, A −1: max(0.5, .8) = .8 | ρ 2, A −2: 2
    logp = _t([[-1.0, -2.0], [-0.5, -0.25]]).requires_grad_()
    x = _mterms(logp, [[L(0.5), L(2.0)], [L(0.5), L(2.0)]], [[1.0, 1.0], [-1.0, -2.0]],
                [[1, 1], [1, 1]])
    loss, stats = OBJECTIVES["aspo"](x, ObjectiveConfig("aspo", clip_low=0.2, clip_high=0.28))
    w = _t([[1.28, 0.5], [0.8, 2.0]])
    torch.testing.assert_close(stats["weight_mean"], w, **TOL)
    assert torch.equal(stats["pos_frac"], _t([[1, 1], [0, 0]]))
    torch.testing.assert_close(loss, _t([[1.28, 2.0 * 0.5], [0.5 * -0.8, 0.25 * -4.0]]), **TOL)
    torch.testing.assert_close(_masked_sum_grad(loss, x, logp),
                               _t([[-1.28, -0.5], [0.8, 4.0]]), **TOL)


def test_r2vpo_loss_and_gradient_through_ratio() -> None:
    # λ = 0.5: loss = −(ρA − λ(ρ−1)²), d loss/dℓ = −ρ(A − 2λ(ρ−1)).
    #   ρ 2,   A 1:  loss −(2 − 0.5) = −1.5;       grad −2(1 − 1) = 0
    #   ρ 0.5, A −1: loss −(−0.5 − 0.125) = 0.625; grad −0.5(−1 + 0.5) = 0.25
    #   ρ 1,   A 2:  loss −2;                       grad −2
    #   ρ 3,   A 0:  loss 0.5·4 = 2;                grad −3(0 − 2) = 6
    logp = _t([[-1.0, -1.0], [-1.0, -1.0]]).requires_grad_()
    x = _mterms(logp, [[L(2.0), L(0.5)], [0.0, L(3.0)]], [[1.0, -1.0], [2.0, 0.0]],
                [[1, 1], [1, 1]])
    loss, stats = OBJECTIVES["r2vpo"](x, ObjectiveConfig("r2vpo", r2vpo_lambda=0.5))
    torch.testing.assert_close(loss, _t([[-1.5, 0.625], [-2.0, 2.0]]), **TOL)
    torch.testing.assert_close(stats["var_penalty_mean"], _t([[0.5, 0.125], [0.0, 2.0]]), **TOL)
    torch.testing.assert_close(_masked_sum_grad(loss, x, logp),
                               _t([[0.0, 0.25], [-2.0, 6.0]]), **TOL)


def test_sapo_soft_gate_values_and_gradient() -> None:
    # τ_pos = 1, τ_neg = 1.05. loss = −(4/τ)σ(τ(ρ−1))A; d/dℓ = −4σ'(τ(ρ−1))·ρ·A.
    logp = _t([[-1.0, -1.0, -1.0]]).requires_grad_()
    x = _mterms(logp, [[L(1.5), L(0.5), L(3.0)]], [[1.0, -2.0, 0.0]], [[1, 1, 1]])
    loss, _ = OBJECTIVES["sapo"](x, ObjectiveConfig("sapo"))
    s_pos, s_neg = _sigmoid(0.5), _sigmoid(1.05 * -0.5)
    torch.testing.assert_close(loss, _t([[-4.0 * s_pos, (8.0 / 1.05) * s_neg, 0.0]]), **TOL)
    grad = _masked_sum_grad(loss, x, logp)
    torch.testing.assert_close(grad, _t([[-4.0 * s_pos * (1 - s_pos) * 1.5,
                                          4.0 * s_neg * (1 - s_neg), 0.0]]), **TOL)


def test_dro_quadratic_penalty() -> None:
    # β = 0.5. loss = −[ℓA − (β/2)(ℓ − ℓ_μ)²]; d/dℓ = −A + β(ℓ − ℓ_μ).
    #   ℓ −1, log ρ 0.4, A 2:   loss 2 + 0.25·0.16 = 2.04;  grad −2 + 0.2 = −1.8
    #   ℓ −0.5, log ρ −0.2, A −1: loss −(0.5 − 0.01) = −0.49; grad 1 − 0.1 = 0.9
    logp = _t([[-1.0, -0.5]]).requires_grad_()
    x = _mterms(logp, [[0.4, -0.2]], [[2.0, -1.0]], [[1, 1]])
    loss, stats = OBJECTIVES["dro"](x, ObjectiveConfig("dro", dro_beta=0.5))
    torch.testing.assert_close(loss, _t([[2.04, -0.49]]), **TOL)
    torch.testing.assert_close(stats["dro_penalty_mean"], _t([[0.04, 0.01]]), **TOL)
    torch.testing.assert_close(_masked_sum_grad(loss, x, logp), _t([[-1.8, 0.9]]), **TOL)


def test_log_growth_weights_successes_by_inverse_probability() -> None:
    # Bandit: π(a) = 0.25, 0.5, 0.8; success 1, 0, 1; A = 0.5, −0.5, 0.2.
    # w = 0.5/0.25 = 2, −0.5 (failure: unweighted), 0.2/0.8 = 0.25.
    logp = _t([[L(0.25)], [L(0.5)], [L(0.8)]]).requires_grad_()
    x = _mterms(logp, [[0.0], [0.0], [0.0]], [[0.5], [-0.5], [0.2]], [[1], [1], [1]],
                success_B=torch.tensor([True, False, True]))
    loss, stats = OBJECTIVES["log_growth"](x, ObjectiveConfig("log_growth"))
    w = _t([[2.0], [-0.5], [0.25]])
    torch.testing.assert_close(stats["log_growth_weight"], w, **TOL)
    torch.testing.assert_close(loss, -logp.detach() * w, **TOL)
    torch.testing.assert_close(_masked_sum_grad(loss, x, logp), -w, **TOL)


def test_log_growth_requires_success_flag() -> None:
    logp = _t([[-1.0]])
    with pytest.raises(ValueError, match="success_B"):
        OBJECTIVES["log_growth"](_mterms(logp, [[0.0]], [[1.0]], [[1]]),
                                 ObjectiveConfig("log_growth"))


def test_pmd_mean_sequence_regression_on_first_valid_token() -> None:
    # τ = 0.5. Row 0: Σ log ρ = 0.6 (masked 9 ignored), r − b = 1 − 0.25 → 0.3 − 0.75 = −0.45,
    # loss 0.2025 on token 0. Row 1 (leading prompt token masked): Σ = −0.2, r − b = −0.25 →
    # −0.1 + 0.25 = 0.15, loss 0.0225 on token 1. d Σ loss / dℓ_k = 2·res·τ·m_k.
    logp = torch.full((2, 3), -1.0, dtype=F64, requires_grad=True)
    x = _mterms(logp, [[0.2, 0.4, 9.0], [5.0, -0.2, 0.0]], [[0.0] * 3, [0.0] * 3],
                [[1, 1, 0], [0, 1, 1]], rewards_B=_t([[1.0, 0.0]])[0],
                baseline_B=_t([[0.25, 0.25]])[0])
    loss, stats = OBJECTIVES["pmd_mean"](x, ObjectiveConfig("pmd_mean", pmd_tau=0.5))
    torch.testing.assert_close(loss, _t([[0.2025, 0.0, 0.0], [0.0, 0.0225, 0.0]]), **TOL)
    torch.testing.assert_close(stats["pmd_seq_loss"], _t([[0.2025] * 3, [0.0225] * 3]), **TOL)
    torch.testing.assert_close(_masked_sum_grad(loss, x, logp),
                               _t([[-0.45, -0.45, 0.0], [0.0, 0.15, 0.15]]), **TOL)


def test_pmd_mean_requires_rewards_and_baseline() -> None:
    logp = _t([[-1.0]])
    x = _mterms(logp, [[0.0]], [[0.0]], [[1]], rewards_B=_t([[1.0]])[0])
    with pytest.raises(ValueError, match="baseline_B"):
        OBJECTIVES["pmd_mean"](x, ObjectiveConfig("pmd_mean"))
