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
    gspo,
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
    with pytest.raises(ValueError, match="unknown loss_fn 'nope'"):
        check_loss_request("nope", {}, rl_inputs)
    with pytest.raises(ValueError, match="missing \\['sequence_ratio_mask'\\]"):
        check_loss_request("gspo", {}, rl_inputs)
    assert check_loss_request("gspo", {}, rl_inputs | {"sequence_ratio_mask"}) == \
        {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    with pytest.raises(ValueError, match=r"stable_reinforce' is not supported.*record_stab"):
        check_loss_request("stable_reinforce", {}, rl_inputs)
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


def test_gspo_hand_values_sequence_ratio_value_and_token_gradients() -> None:
    # datum 0: positions 0-2, mask marks 1 and 2; datum 1: positions 3-4, mask marks 3 and 4
    logp = t(-5.0, math.log(0.5), math.log(0.2), math.log(0.3), math.log(0.9)).requires_grad_()
    sampler = t(-1.0, math.log(0.25), math.log(0.1), math.log(0.6), math.log(0.9))
    adv = t(0.0, 1.0, 1.0, -2.0, -2.0)
    mask = t(0.0, 1.0, 1.0, 1.0, 1.0)
    datum = torch.tensor([0, 0, 0, 1, 1])
    loss, metrics = gspo(logp, sampler, adv, mask, datum, ClipConfig(0.8, 1.2))
    # datum 0: log-ratios over the mask (log 2, log 2) → s = 2, clipped to 1.2 for A = 1:
    #   min(2·1, 1.2·1) = 1.2 on each of the two tokens; position 0 has A = 0.
    # datum 1: log-ratios (log 0.5, 0) → s = exp(mean) = sqrt(0.5) ≈ 0.7071; A = −2:
    #   min(0.7071·−2, 0.8·−2) = −1.6 on each token (the clipped branch wins).
    assert loss.item() == pytest.approx(-(1.2 * 2 - 1.6 * 2))
    assert metrics["loss:sum"].item() == pytest.approx(loss.item())
    loss.backward()
    # both datums sit on their clipped branch: no gradient anywhere
    assert logp.grad is not None
    assert logp.grad.tolist() == pytest.approx([0.0] * 5)


def test_gspo_unclipped_token_gradient_is_minus_s_times_a() -> None:
    # one datum, s = exp(mean(log 1.1, log 1.0)) inside [0.8, 1.2]: each token's gradient is
    # −s·A (the sequence ratio's value times the token's own ∂ℓ); an unmasked position keeps
    # the same ratio value
    logp = t(math.log(1.1), 0.0, -0.5).requires_grad_()
    sampler = t(0.0, 0.0, -3.0)
    adv = t(1.0, 2.0, 0.5)
    loss, _ = gspo(logp, sampler, adv, t(1.0, 1.0, 0.0), torch.tensor([0, 0, 0]),
                   ClipConfig(0.8, 1.2))
    s = math.sqrt(1.1)
    assert loss.item() == pytest.approx(-s * (1.0 + 2.0 + 0.5))
    loss.backward()
    assert logp.grad is not None
    assert logp.grad.tolist() == pytest.approx([-s * 1.0, -s * 2.0, -s * 0.5])


def test_gspo_on_policy_is_the_reinforce_gradient_and_an_empty_mask_means_ratio_one() -> None:
    logp = t(math.log(0.3), math.log(0.6), math.log(0.9)).requires_grad_()
    adv = t(1.0, -0.5, 2.0)
    loss, _ = gspo(logp, logp.detach(), adv, t(0.0, 0.0, 0.0), torch.tensor([0, 0, 1]),
                   ClipConfig(0.8, 1.2))
    assert loss.item() == pytest.approx(-(1.0 - 0.5 + 2.0))
    loss.backward()
    assert logp.grad is not None
    assert logp.grad.tolist() == pytest.approx((-adv).tolist())


def test_tinker_loss_dispatches_gspo_with_datum_indices() -> None:
    logp, sampler = t(math.log(2.0), 0.0), t(0.0, 0.0)
    inputs = {"logprobs": sampler, "advantages": t(1.0, 1.0),
              "sequence_ratio_mask": t(1.0, 1.0), "datum": torch.tensor([0, 1])}
    loss, _ = tinker_loss("gspo", logp, inputs, {"clip_low_threshold": 0.5,
                                                 "clip_high_threshold": 3.0})
    # two one-token datums: ratios 2 and 1, inside the bounds
    assert loss.item() == pytest.approx(-3.0)
