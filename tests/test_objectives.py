"""Gates and per-token objectives (METHODS.md, "Gates and weights", "Objectives").

Hand-computed values on small tensors; the log-ratio ℓ − ℓ_μ is chosen as log ρ for the ratios
ρ we want, so every expected number is written from ρ and A.
"""

from __future__ import annotations

import math

import pytest
import torch

from rlscope.methods.gates import GATES
from rlscope.methods.objectives import OBJECTIVES, PolicyTerms, ratio
from rlscope.methods.spec import GateConfig, ObjectiveConfig

F64 = torch.float64
TOL = {"atol": 1e-12, "rtol": 1e-12}


def _t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=F64)


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
    w, stats = GATES["none"](adv, _t([[-0.1, -1.0, -3.0]]), GateConfig("none"))
    assert torch.equal(w, adv)
    assert stats == {}


def test_gate_delight_values() -> None:
    # g = σ(A · (−ℓ) / η), w = g · A, η = 2.
    adv = _t([[2.0, -2.0, 1.0, 0.0]])
    logp = _t([[-1.0, -1.0, -0.5, -4.0]])
    w, stats = GATES["delight"](adv, logp, GateConfig("delight", eta=2.0))
    g = [_sigmoid(2.0 * 1.0 / 2.0),    # surprising success: σ(1) ≈ 0.731
         _sigmoid(-2.0 * 1.0 / 2.0),   # surprising failure damped: σ(−1) ≈ 0.269
         _sigmoid(1.0 * 0.5 / 2.0),    # σ(0.25)
         _sigmoid(0.0)]                # A = 0 → g = 1/2, w = 0
    torch.testing.assert_close(stats["gate_mean"], _t([g]), **TOL)
    torch.testing.assert_close(w, _t([[g[0] * 2.0, g[1] * -2.0, g[2] * 1.0, 0.0]]), **TOL)
    assert abs(g[0] - 0.7310585786300049) < 1e-15


def test_gate_delight_temperature() -> None:
    # Larger η flattens the gate towards 1/2: σ(1/10) for η = 10.
    _, stats = GATES["delight"](_t([[2.0]]), _t([[-0.5]]), GateConfig("delight", eta=10.0))
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
