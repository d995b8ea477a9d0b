"""Tinker-semantics losses: hand-computed values, sums (never means), gradient identities."""

from __future__ import annotations

import math

import pytest
import torch

from rlscope.serve.losses import (
    ClipConfig,
    DroConfig,
    check_loss_request,
    cispo,
    cross_entropy,
    dro,
    importance_sampling,
    ppo,
    tinker_loss,
)

F64 = torch.float64


def t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


def test_cross_entropy_is_a_weighted_sum_with_real_weights() -> None:
    loss, metrics = cross_entropy(t(-1.0, -2.0, -0.5), t(1.0, -2.0, 0.5))
    # -(1·-1 + -2·-2 + 0.5·-0.5) = -(−1 + 4 − 0.25) = −2.75
    assert loss.item() == pytest.approx(-2.75)
    assert metrics["loss:sum"].item() == pytest.approx(-2.75)


def test_importance_sampling_hand_values_and_gradient() -> None:
    logp = t(math.log(0.5), math.log(0.2)).requires_grad_()
    sampler = t(math.log(0.25), math.log(0.2))
    loss, _ = importance_sampling(logp, sampler, t(1.0, -3.0))
    # ρ = (2, 1): −(2·1 + 1·−3) = 1
    assert loss.item() == pytest.approx(1.0)
    loss.backward()
    assert logp.grad is not None
    assert logp.grad.tolist() == pytest.approx([-2.0, 3.0])  # −ρ·A


def test_ppo_clips_with_absolute_bounds() -> None:
    logp = t(math.log(2.0), math.log(0.5), math.log(1.1), math.log(0.5))
    sampler = t(0.0, 0.0, 0.0, 0.0)
    adv = t(1.0, 1.0, -1.0, -1.0)
    loss, _ = ppo(logp, sampler, adv, ClipConfig(0.8, 1.2))
    # tokens: min(2, 1.2)=1.2; min(0.5, 0.8)=0.5; min(−1.1, −1.1)=−1.1; min(−0.5, −0.8)=−0.8
    assert loss.item() == pytest.approx(-(1.2 + 0.5 - 1.1 - 0.8))


def test_on_policy_ppo_and_is_have_the_reinforce_gradient() -> None:
    logp_values = (math.log(0.3), math.log(0.6), math.log(0.9))
    adv = t(1.0, -0.5, 2.0)
    grads = []
    for fn in (lambda lp: importance_sampling(lp, lp.detach(), adv),
               lambda lp: ppo(lp, lp.detach(), adv, ClipConfig(0.8, 1.2)),
               lambda lp: cispo(lp, lp.detach(), adv, ClipConfig(0.0, 4.0)),
               lambda lp: dro(lp, lp.detach(), adv, DroConfig(0.3))):
        logp = t(*logp_values).requires_grad_()
        fn(logp)[0].backward()
        assert logp.grad is not None
        grads.append(logp.grad.tolist())
    for g in grads:
        assert g == pytest.approx((-adv).tolist())


def test_cispo_weight_is_the_clipped_detached_ratio() -> None:
    logp = t(math.log(6.0), math.log(0.5)).requires_grad_()
    loss, _ = cispo(logp, t(0.0, 0.0), t(1.0, 2.0), ClipConfig(0.0, 4.0))
    # weights (4, 0.5): −(4·1·log 6 + 0.5·2·log 0.5)
    assert loss.item() == pytest.approx(-(4 * math.log(6.0) + 1.0 * math.log(0.5)))
    loss.backward()
    assert logp.grad is not None
    assert logp.grad.tolist() == pytest.approx([-4.0, -1.0])


def test_dro_penalises_the_squared_log_ratio() -> None:
    loss, _ = dro(t(-1.0, -2.0), t(-1.5, -2.0), t(1.0, 0.0), DroConfig(0.4))
    # −[(−1·1 − 0.2·0.25) + (0 − 0)] = 1.05
    assert loss.item() == pytest.approx(1.05)


def test_losses_are_sums_so_splitting_the_batch_adds_up() -> None:
    logp, sampler, adv = t(-1.0, -0.2, -3.0, -0.7), t(-1.1, -0.3, -2.5, -0.7), t(1, -1, 2, 0.5)
    whole = ppo(logp, sampler, adv, ClipConfig(0.8, 1.2))[0]
    parts = ppo(logp[:1], sampler[:1], adv[:1], ClipConfig(0.8, 1.2))[0] + \
        ppo(logp[1:], sampler[1:], adv[1:], ClipConfig(0.8, 1.2))[0]
    assert whole.item() == pytest.approx(parts.item())


def test_check_loss_request_validates_names_keys_and_inputs() -> None:
    rl_inputs = {"target_tokens", "logprobs", "advantages"}
    assert check_loss_request("ppo", {}, rl_inputs) == {"clip_low_threshold": 0.8,
                                                        "clip_high_threshold": 1.2}
    assert check_loss_request("cispo", {"clip_high_threshold": 2.0}, rl_inputs) == \
        {"clip_low_threshold": 0.0, "clip_high_threshold": 2.0}
    with pytest.raises(ValueError, match="unknown loss_fn 'gspo'"):
        check_loss_request("gspo", {}, rl_inputs)
    with pytest.raises(ValueError, match="not valid for importance_sampling"):
        check_loss_request("importance_sampling", {"beta": 1.0}, rl_inputs)
    with pytest.raises(ValueError, match="needs loss_fn_config keys"):
        check_loss_request("dro", {}, rl_inputs)
    with pytest.raises(ValueError, match="missing"):
        check_loss_request("importance_sampling", {}, {"target_tokens"})
    with pytest.raises(ValueError, match="<="):
        check_loss_request("ppo", {"clip_low_threshold": 1.5}, rl_inputs)


def test_tinker_loss_defaults_cross_entropy_weights_to_one() -> None:
    loss, _ = tinker_loss("cross_entropy", t(-1.0, -2.0), {}, {})
    assert loss.item() == pytest.approx(3.0)
