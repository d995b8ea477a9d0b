"""KL estimators, exact KL, entropy, the KL and entropy coefficient controllers and the value
loss (METHODS.md, "KL and entropy regularisers")."""

from __future__ import annotations

import math

import pytest
import torch
from fp64 import F64, TOL
from fp64 import t as _t

from rlscope.methods.regularizers import (
    KL_ESTIMATORS,
    SAMPLED_KL_ESTIMATORS,
    adaptive_entropy_update,
    adaptive_kl_update,
    entropy_from_logp,
    full_kl,
    kl_estimate,
    kl_full,
    kl_warmup_beta,
    value_loss,
)
from rlscope.methods.spec import EntropyConfig, KLConfig, ValueConfig
from rlscope.sampling.processors import processed_logprobs

# d = ℓ − ℓ_target = 0, 1, −1, 2 (ℓ_target = −1 everywhere).
LOGP = _t([[-1.0, 0.0, -2.0, 1.0]])
LOGP_TARGET = _t([[-1.0, -1.0, -1.0, -1.0]])

ESTIMATES = {
    "k1": [0.0, 1.0, -1.0, 2.0],
    "k2": [0.5 * 0.0**2, 0.5 * 1.0**2, 0.5 * (-1.0) ** 2, 0.5 * 2.0**2],
    "k3": [math.exp(-0.0) + 0.0 - 1, math.exp(-1.0) + 1.0 - 1, math.exp(1.0) - 1.0 - 1,
           math.exp(-2.0) + 2.0 - 1],
    "abs": [0.0, 1.0, 1.0, 2.0],
}


@pytest.mark.parametrize("estimator", SAMPLED_KL_ESTIMATORS)
def test_kl_estimators_by_hand(estimator: str) -> None:
    out = kl_estimate(LOGP, LOGP_TARGET, estimator)
    torch.testing.assert_close(out, _t([ESTIMATES[estimator]]), **TOL)


def test_k3_is_nonnegative_per_token_on_random_inputs() -> None:
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(64, 32, generator=g, dtype=F64) * 3
    target = torch.randn(64, 32, generator=g, dtype=F64) * 3
    assert bool((kl_estimate(logp, target, "k3") >= 0).all())
    # Near d = 0 (where exp(−d) + d − 1 cancels) it stays ≥ 0 too.
    tiny = torch.linspace(-1e-6, 1e-6, 101, dtype=F64)[None]
    assert bool((kl_estimate(tiny, torch.zeros_like(tiny), "k3") >= 0).all())


def test_unknown_estimator() -> None:
    with pytest.raises(ValueError, match="valid: k1, k2, k3, abs"):
        kl_estimate(LOGP, LOGP_TARGET, "k4")
    # `full` is a valid estimator of the loss, but not from sampled-token log-probs alone.
    assert KL_ESTIMATORS == ("k1", "k2", "k3", "abs", "full", "is_corrected")
    with pytest.raises(ValueError, match="full needs the whole distributions: kl_full"):
        kl_estimate(LOGP, LOGP_TARGET, "full")
    with pytest.raises(ValueError, match="is_corrected the behaviour log-probs"):
        kl_estimate(LOGP, LOGP_TARGET, "is_corrected")


def test_full_kl_hand_example() -> None:
    # π = (1, 2, 3)/6 from logits (0, log 2, log 3); target uniform 1/3.
    # KL = 1/6·log((1/6)/(1/3)) + 2/6·log((2/6)/(1/3)) + 3/6·log((3/6)/(1/3))
    #    = 1/6·log 0.5 + 0 + 1/2·log 1.5.
    logits = _t([[0.0, math.log(2.0), math.log(3.0)]])[None]
    target = torch.zeros(1, 1, 3, dtype=F64)
    want = 1 / 6 * math.log(0.5) + 2 / 6 * math.log(1.0) + 3 / 6 * math.log(1.5)
    out = full_kl(logits, target)
    assert out.shape == (1, 1)
    assert abs(float(out) - want) < 1e-12
    # Identical distributions (up to a logit shift) have KL 0.
    assert abs(float(full_kl(logits, logits + 7.0))) < 1e-12


def test_full_kl_matches_manual_sum_and_sampled_estimators_in_expectation() -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 3, 5, generator=g, dtype=F64)
    target = torch.randn(2, 3, 5, generator=g, dtype=F64)
    out = full_kl(logits, target)
    for b in range(2):
        for t in range(3):
            zp = sum(math.exp(v) for v in logits[b, t].tolist())
            zq = sum(math.exp(v) for v in target[b, t].tolist())
            kl = 0.0
            for lp, lq in zip(logits[b, t].tolist(), target[b, t].tolist(), strict=True):
                p, q = math.exp(lp) / zp, math.exp(lq) / zq
                kl += p * math.log(p / q)
            assert abs(float(out[b, t]) - kl) < 1e-12
    # k1 and k3 are unbiased: Σ_v π(v)·k(ℓ_v − ℓ_target,v) = KL exactly.
    logp, logq = logits.log_softmax(-1), target.log_softmax(-1)
    for est in ("k1", "k3"):
        expectation = (logp.exp() * kl_estimate(logp, logq, est)).sum(-1)
        torch.testing.assert_close(expectation, out, **TOL)


def test_entropy_from_logp() -> None:
    # uniform over 4 → log 4; (1/2, 1/4, 1/4) → 1/2·log 2 + 2·1/4·log 4 = 1.5·log 2;
    # one-hot (logp −inf elsewhere) → exactly 0, not nan.
    uniform = torch.full((4,), math.log(0.25), dtype=F64)
    skewed = torch.tensor([math.log(0.5), math.log(0.25), math.log(0.25), -math.inf],
                          dtype=F64)
    onehot = torch.tensor([0.0, -math.inf, -math.inf, -math.inf], dtype=F64)
    out = entropy_from_logp(torch.stack([uniform, skewed, onehot])[None])
    assert out.shape == (1, 3)
    torch.testing.assert_close(out, _t([[math.log(4.0), 1.5 * math.log(2.0), 0.0]]), **TOL)


def test_adaptive_kl_controller_worked_example() -> None:
    cfg = KLConfig(target_value=6.0, horizon=10000.0)
    # KL 9: e = clip(9/6 − 1, −0.2, 0.2) = clip(0.5) = 0.2 → β = 0.2·(1 + 0.2·96/10000).
    assert abs(adaptive_kl_update(0.2, 9.0, 96, cfg) - 0.2 * (1 + 0.2 * 96 / 10000)) < 1e-15
    assert abs(adaptive_kl_update(0.2, 9.0, 96, cfg) - 0.200384) < 1e-12
    # KL 3: e = clip(3/6 − 1 = −0.5) = −0.2 → β = 0.2·(1 − 0.2·96/10000) = 0.199616.
    assert abs(adaptive_kl_update(0.2, 3.0, 96, cfg) - 0.199616) < 1e-12
    # KL 6.6: e = 0.1 (inside the clip) → β = 0.2·(1 + 0.1·96/10000) = 0.200192.
    assert abs(adaptive_kl_update(0.2, 6.6, 96, cfg) - 0.200192) < 1e-12
    # KL at target: β unchanged.
    assert adaptive_kl_update(0.2, 6.0, 96, cfg) == 0.2


def test_value_loss_unclipped() -> None:
    values = _t([[1.0, 0.5]]).requires_grad_()
    loss, stats = value_loss(values, _t([[0.0, 0.0]]), _t([[0.0, 1.0]]), ValueConfig(clip=0.0))
    # ½(V − R)²: ½·1² = 0.5, ½·0.5² = 0.125.
    torch.testing.assert_close(loss, _t([[0.5, 0.125]]), **TOL)
    assert stats == {}


def test_value_loss_clipped() -> None:
    # c = 0.2. Token by token (V, V_old, R):
    #   (1.0, 0.5, 0.0): (V−R)² = 1;    V_clip = 0.5 + 0.2 = 0.7, (0.7)² = 0.49 → ½·1 = 0.5
    #   (0.5, 0.0, 1.0): (V−R)² = 0.25; V_clip = 0.0 + 0.2 = 0.2, (0.2−1)² = 0.64 → ½·0.64
    #   (0.6, 0.5, 0.0): |V − V_old| = 0.1 < c, both 0.36 → ½·0.36 = 0.18
    values = _t([[1.0, 0.5, 0.6]]).requires_grad_()
    loss, stats = value_loss(values, _t([[0.5, 0.0, 0.5]]), _t([[0.0, 1.0, 0.0]]),
                             ValueConfig(clip=0.2))
    torch.testing.assert_close(loss, _t([[0.5, 0.5 * 0.64, 0.18]]), **TOL)
    assert torch.equal(stats["value_clipfrac"], torch.tensor([[0.0, 1.0, 0.0]]))
    loss.sum().backward()
    # Unclipped branch: d/dV ½(V−R)² = V − R = 1.0; clipped branch saturated → 0;
    # tie at the third token → V − R = 0.6.
    torch.testing.assert_close(values.grad, _t([[1.0, 0.0, 0.6]]), **TOL)


# ------------------------------------------------------------------- full KL in the loss


def test_kl_full_two_token_vocabulary_by_hand() -> None:
    # Position 0: π = (1/2, 1/2), π_ref = (1/4, 3/4):
    #   KL = 1/2·log((1/2)/(1/4)) + 1/2·log((1/2)/(3/4)) = 1/2·log 2 + 1/2·log(2/3)
    #      = 1/2·log(4/3) ≈ 0.143841.
    # Position 1: π = (4/5, 1/5), π_ref = (1/2, 1/2):
    #   KL = 4/5·log(8/5) + 1/5·log(2/5) ≈ 0.376002 − 0.183258 = 0.192745.
    logp = torch.tensor([[[0.5, 0.5], [0.8, 0.2]]], dtype=F64).log()
    logq = torch.tensor([[[0.25, 0.75], [0.5, 0.5]]], dtype=F64).log()
    out = kl_full(logp, logq)
    assert out.shape == (1, 2)
    want = [0.5 * math.log(4 / 3), 0.8 * math.log(1.6) + 0.2 * math.log(0.4)]
    torch.testing.assert_close(out, _t([want]), **TOL)
    assert abs(want[0] - 0.143841) < 1e-6 and abs(want[1] - 0.192745) < 1e-6
    # KL is not symmetric: KL(π_ref ‖ π) at position 0 = 1/4·log(1/2) + 3/4·log(3/2) ≈ 0.130812.
    reverse = 0.25 * math.log(0.5) + 0.75 * math.log(1.5)
    assert abs(float(kl_full(logq, logp)[0, 0]) - reverse) < 1e-12
    assert abs(reverse - want[0]) > 0.01


def test_kl_full_gradient_matches_autograd_of_the_explicit_formula() -> None:
    g = torch.Generator().manual_seed(2)
    z = torch.randn(2, 3, 5, generator=g, dtype=F64).requires_grad_()
    logq = torch.randn(2, 3, 5, generator=g, dtype=F64).log_softmax(-1)
    weights = torch.randn(2, 3, generator=g, dtype=F64)  # a generic upstream gradient
    (kl_full(z.log_softmax(-1), logq) * weights).sum().backward()
    assert z.grad is not None
    ours = z.grad.clone()
    # The explicit formula Σ_v softmax(z)_v·(log softmax(z)_v − log q_v), through autograd...
    z2 = z.detach().clone().requires_grad_()
    explicit = (z2.softmax(-1) * (z2.log_softmax(-1) - logq)).sum(-1)
    (explicit * weights).sum().backward()
    assert z2.grad is not None
    torch.testing.assert_close(ours, z2.grad, **TOL)
    # ...and in closed form: ∂KL/∂z_v = π_v·(log π_v − log q_v − KL).
    p, logp = z.detach().softmax(-1), z.detach().log_softmax(-1)
    kl = (p * (logp - logq)).sum(-1, keepdim=True)
    torch.testing.assert_close(ours, weights[..., None] * p * (logp - logq - kl), **TOL)
    # The gradient vanishes where π = π_ref (the KL's minimum).
    z3 = logq.detach().clone().requires_grad_()
    kl_full(z3.log_softmax(-1), logq).sum().backward()
    assert z3.grad is not None and float(z3.grad.abs().max()) < 1e-15


def test_kl_full_on_a_shared_kept_set_is_the_kl_of_the_renormalised_distributions() -> None:
    # Logits (0, log 3, 5) and (log 3, 0, −5) with token 2 outside the top-k kept set of both:
    # the processed distributions are (1/4, 3/4, 0) and (3/4, 1/4, 0), so
    # KL = 1/4·log(1/3) + 3/4·log 3 = 1/2·log 3 ≈ 0.549306, with 0·(−inf − (−inf)) read as 0.
    keep = torch.tensor([[[True, True, False]]])
    z = torch.tensor([[[0.0, math.log(3.0), 5.0]]], dtype=F64).requires_grad_()
    ref = torch.tensor([[[math.log(3.0), 0.0, -5.0]]], dtype=F64)
    out = kl_full(processed_logprobs(z, 1.0, keep), processed_logprobs(ref, 1.0, keep))
    assert abs(float(out.detach()) - 0.5 * math.log(3.0)) < 1e-12
    out.sum().backward()
    assert z.grad is not None and bool(torch.isfinite(z.grad).all())
    assert float(z.grad[0, 0, 2]) == 0.0  # no gradient into a token that cannot be drawn
    # On the kept pair, ∂KL/∂z_v = π_v·(log π_v − log q_v − KL):
    #   z_0: 1/4·(log(1/3) − 1/2·log 3) = −3/8·log 3;  z_1: 3/4·(log 3 − 1/2·log 3) = 3/8·log 3.
    want = [-0.375 * math.log(3.0), 0.375 * math.log(3.0), 0.0]
    torch.testing.assert_close(z.grad, torch.tensor([[want]], dtype=F64), **TOL)


# ------------------------------------------------------------------ coefficient controllers


def test_kl_warmup_beta_is_zero_then_the_configured_coefficient() -> None:
    cfg = KLConfig(coef=0.1, control="warmup", warmup_steps=3)
    # steps 0, 1, 2 are the warm-up (β = 0); from step 3 on β = coef = 0.1.
    assert [kl_warmup_beta(s, cfg) for s in range(6)] == [0.0, 0.0, 0.0, 0.1, 0.1, 0.1]
    # No warm-up steps: β = coef from the first step.
    assert kl_warmup_beta(0, KLConfig(coef=0.1, control="warmup", warmup_steps=0)) == 0.1


def test_adaptive_entropy_controller_worked_example() -> None:
    cfg = EntropyConfig(control="adaptive", target=0.5, delta=0.01, window=3)
    # Last 3 of (0.9, 0.3, 0.2): H̄ = 1.4/3 ≈ 0.467 < 0.5 → c = 0.05 + 0.01 = 0.06.
    assert adaptive_entropy_update(0.05, [0.9, 0.3, 0.2], cfg) == 0.05 + 0.01
    # The window drops old values: last 3 of (0.0, 0.9, 0.6, 0.3) average 1.8/3 = 0.6 ≥ 0.5
    # → c = 0.05 − 0.01 = 0.04 (all four would average 0.45 < 0.5 and raise c instead).
    assert adaptive_entropy_update(0.05, [0.0, 0.9, 0.6, 0.3], cfg) == 0.05 - 0.01
    assert adaptive_entropy_update(
        0.05, [0.0, 0.9, 0.6, 0.3], EntropyConfig("adaptive", 0.5, 0.01, window=4)) == 0.05 + 0.01
    # Fewer values than the window at the start of a run: their mean, 0.4 < 0.5 → raise.
    assert adaptive_entropy_update(0.0, [0.4], cfg) == 0.01
    # At the target exactly (not below) c falls; it never goes below 0: max(0.004 − 0.01, 0).
    assert adaptive_entropy_update(0.05, [0.5], cfg) == 0.05 - 0.01
    assert adaptive_entropy_update(0.004, [0.7, 0.8, 0.9], cfg) == 0.0
    with pytest.raises(ValueError, match="at least one entropy value"):
        adaptive_entropy_update(0.05, [], cfg)
