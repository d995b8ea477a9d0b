"""Influence gates (METHODS.md, "Gates and weights"): the uncertainty, entropy-guard and
freshness variants of delight.

Hand-computed values use log-probs ℓ = log p for "nice" p, since σ(log x) = x/(1 + x). The
identities check that each variant reduces to delight bit for bit at its neutral setting.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from fp64 import F64, TOL
from fp64 import t as _t

from rlscope.config import RunConfig, TrainConfig
from rlscope.methods import MethodConfig
from rlscope.methods.gates import (
    GATES,
    GateInputs,
    probs_mean_BT,
    reward_uncertainty_B,
)
from rlscope.methods.spec import GateConfig
from rlscope.tasks import TaskConfig
from rlscope.train import train


def _v(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def test_registry_lists_every_gate() -> None:
    assert set(GATES) == {"none", "delight", "uncertainty_shift", "uncertainty_filter",
                          "uncertainty_shrink", "entropy_guard", "freshness", "entropy_top",
                          "opsm"}


# --------------------------------------------------------------------------- inputs


def test_reward_uncertainty_within_groups_and_batch() -> None:
    rewards = _v([1.0, 0.0, 1.0, 1.0])
    # Groups of 2: {1, 0} has population std 1/2, {1, 1} has 0.
    torch.testing.assert_close(reward_uncertainty_B(rewards, 2), _v([0.5, 0.5, 0.0, 0.0]), **TOL)
    # Ungrouped: mean 3/4, variance (3·(1/4)² + (3/4)²)/4 = 3/16, broadcast to every sample.
    expected = math.sqrt(3.0 / 16.0)
    torch.testing.assert_close(reward_uncertainty_B(rewards, 1), _v([expected] * 4), **TOL)


def test_reward_uncertainty_rejects_a_bad_layout() -> None:
    with pytest.raises(ValueError, match="divide"):
        reward_uncertainty_B(_v([1.0, 0.0, 1.0]), 2)
    with pytest.raises(ValueError, match="1-D"):
        reward_uncertainty_B(_t([[1.0, 0.0]]), 1)


def test_probs_mean_is_one_over_vocab() -> None:
    # mean_v π(v) = (Σ_v π(v))/V = 1/V for any distribution, also one with a top-k kept set.
    logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0), dtype=F64)
    logits[0, 0, :3] = -math.inf
    logp_BTV = logits.log_softmax(-1)
    mean_BT = probs_mean_BT(logp_BTV[..., 0], 5)
    torch.testing.assert_close(mean_BT, torch.full((2, 3), 0.2, dtype=F64), **TOL)
    torch.testing.assert_close(mean_BT, logp_BTV.exp().mean(-1), **TOL)
    with pytest.raises(ValueError, match="vocab_size"):
        probs_mean_BT(mean_BT, 0)


# --------------------------------------------------------------------------- hand values


def test_uncertainty_shift_values() -> None:
    # g = σ((A·(−ℓ) − s·u)/η), s = 2, η = 1, u = 0.5 (row 0) and 0 (row 1).
    adv = _t([[2.0, -1.0], [1.0, 0.0]])
    logp = _t([[-1.0, -2.0], [-0.5, -1.0]])
    x = GateInputs(adv, logp, uncertainty_B=_v([0.5, 0.0]))
    w, stats = GATES["uncertainty_shift"](x, GateConfig("uncertainty_shift", s=2.0))
    g = [[_sigmoid(2.0 * 1.0 - 2.0 * 0.5),    # σ(1)
          _sigmoid(-1.0 * 2.0 - 2.0 * 0.5)],  # σ(−3)
         [_sigmoid(1.0 * 0.5), 0.5]]          # u = 0: plain delight; A = 0 → 1/2
    torch.testing.assert_close(stats["gate_mean"], _t(g), **TOL)
    torch.testing.assert_close(w, _t([[2.0 * g[0][0], -g[0][1]], [g[1][0], 0.0]]), **TOL)
    torch.testing.assert_close(stats["uncertainty_mean"], _t([[0.5, 0.5], [0.0, 0.0]]), **TOL)


def test_uncertainty_filter_values() -> None:
    # τ = 0.5, η = 2: row 0 (u = 0.2) keeps the DG weight, row 1 (u = 0.8) is dropped,
    # row 2 (u = τ exactly) is kept (u ≤ τ).
    adv = _t([[2.0, -2.0], [1.0, 1.0], [1.0, 0.0]])
    logp = _t([[-1.0, -1.0], [-0.5, -0.5], [-2.0, -1.0]])
    x = GateInputs(adv, logp, uncertainty_B=_v([0.2, 0.8, 0.5]))
    w, stats = GATES["uncertainty_filter"](x, GateConfig("uncertainty_filter", eta=2.0))
    expected = [[2.0 * _sigmoid(1.0), -2.0 * _sigmoid(-1.0)],  # σ(2·1/2), σ(−2·1/2)
                [0.0, 0.0],
                [_sigmoid(1.0), 0.0]]                          # σ(1·2/2)
    torch.testing.assert_close(w, _t(expected), **TOL)
    torch.testing.assert_close(stats["kept_frac"], _t([[1.0, 1.0], [0.0, 0.0], [1.0, 1.0]]))
    torch.testing.assert_close(stats["uncertainty_mean"],
                               _t([[0.2, 0.2], [0.8, 0.8], [0.5, 0.5]]), **TOL)


def test_uncertainty_shrink_values() -> None:
    # s = 1, u = 1: A′ = A/2 = [1, −2]; w = σ(A′·(−ℓ))·A′ = [σ(1)·1, σ(−2·0.5)·(−2)].
    x = GateInputs(_t([[2.0, -4.0]]), _t([[-1.0, -0.5]]), uncertainty_B=_v([1.0]))
    w, stats = GATES["uncertainty_shrink"](x, GateConfig("uncertainty_shrink", s=1.0))
    torch.testing.assert_close(w, _t([[_sigmoid(1.0), -2.0 * _sigmoid(-1.0)]]), **TOL)
    torch.testing.assert_close(stats["gate_mean"], _t([[_sigmoid(1.0), _sigmoid(-1.0)]]), **TOL)


def test_entropy_guard_values() -> None:
    # V = 4, so mean_v π(v) = 1/4; s = 0.5, η = 1; σ(log x) = x/(1 + x).
    p = [0.75, 0.1, 0.75, 0.5]
    adv = _t([[1.0, 1.0, -1.0, 2.0]])
    logp = _t([[math.log(q) for q in p]])
    x = GateInputs(adv, logp, probs_mean_BT=probs_mean_BT(logp, 4))
    w, stats = GATES["entropy_guard"](x, GateConfig("entropy_guard"))
    # t0: g = σ(log 4/3) = 4/7; excess 0.75 − 0.25 = 0.5 → factor 1 − 0.5·0.5 = 0.75; w = 3/7.
    # t1: g = σ(log 10) = 10/11; π < 1/4 → factor 1; w = 10/11.
    # t2: A < 0 → factor 1; g = σ(log 3/4) = 3/7; w = −3/7.
    # t3: g = σ(2·log 2) = 4/5; excess 0.25 → factor 0.875; w = 4/5 · 2 · 0.875 = 1.4.
    torch.testing.assert_close(stats["entropy_guard_mean"], _t([[0.75, 1.0, 1.0, 0.875]]),
                               **TOL)
    torch.testing.assert_close(stats["gate_mean"], _t([[4 / 7, 10 / 11, 3 / 7, 4 / 5]]), **TOL)
    torch.testing.assert_close(w, _t([[3 / 7, 10 / 11, -3 / 7, 1.4]]), **TOL)


def test_freshness_values() -> None:
    # λ_age = 0.1, ages 0 and 10 → factors 1 and e^−1; g = σ(log 3) = 3/4 (ℓ = log 1/3, A = 1).
    logp = _t([[math.log(1 / 3)], [math.log(1 / 3)]])
    x = GateInputs(_t([[1.0], [1.0]]), logp, age_B=_v([0.0, 10.0]))
    w, stats = GATES["freshness"](x, GateConfig("freshness", gate_age_decay=0.1))
    torch.testing.assert_close(w, _t([[0.75], [0.75 * math.exp(-1.0)]]), **TOL)
    torch.testing.assert_close(stats["freshness_weight"], _t([[1.0], [math.exp(-1.0)]]), **TOL)
    torch.testing.assert_close(stats["batch_age"], _t([[0.0], [10.0]]), **TOL)


@pytest.mark.parametrize(("name", "missing"), [
    ("uncertainty_shift", "uncertainty_B"),
    ("uncertainty_filter", "uncertainty_B"),
    ("uncertainty_shrink", "uncertainty_B"),
    ("entropy_guard", "probs_mean_BT"),
    ("freshness", "age_B"),
])
def test_missing_input_raises(name: str, missing: str) -> None:
    x = GateInputs(_t([[1.0]]), _t([[-1.0]]))
    with pytest.raises(ValueError, match=missing):
        GATES[name](x, GateConfig(name))


# --------------------------------------------------------------------------- identities


def _random_inputs(seed: int = 0) -> GateInputs:
    g = torch.Generator().manual_seed(seed)
    adv = torch.randn(4, 6, generator=g, dtype=F64)
    logp = torch.rand(4, 6, generator=g, dtype=F64).clamp_min(1e-3).log()
    rewards = torch.randint(0, 2, (4,), generator=g).to(F64)
    return GateInputs(adv, logp, uncertainty_B=reward_uncertainty_B(rewards, 2),
                      probs_mean_BT=probs_mean_BT(logp, 7), age_B=torch.zeros(4, dtype=F64))


@pytest.mark.parametrize("eta", [0.5, 1.0, 3.0])
@pytest.mark.parametrize(("name", "cfg_kwargs", "zero_uncertainty"), [
    # Rewards in [0, 1] have population std ≤ 1/2, so the default τ = 0.5 keeps every sample.
    ("uncertainty_filter", {}, False),
    ("uncertainty_shift", {"s": 0.0}, False),
    ("uncertainty_shrink", {}, True),
    ("entropy_guard", {"guard_scale": 0.0}, False),
    ("freshness", {}, False),  # age 0
])
def test_neutral_setting_is_delight_bit_for_bit(name: str, cfg_kwargs: dict[str, float],
                                                zero_uncertainty: bool, eta: float) -> None:
    x = _random_inputs()
    if zero_uncertainty:
        x = dataclasses.replace(x, uncertainty_B=torch.zeros(4, dtype=F64))
    w, stats = GATES[name](x, GateConfig(name, eta=eta, **cfg_kwargs))
    w_dg, stats_dg = GATES["delight"](x, GateConfig("delight", eta=eta))
    assert torch.equal(w, w_dg)
    assert torch.equal(stats["gate_mean"], stats_dg["gate_mean"])


def test_the_gates_move_away_from_delight_off_neutral() -> None:
    x = _random_inputs()
    x = dataclasses.replace(x, uncertainty_B=torch.full((4,), 0.3, dtype=F64),
                            age_B=torch.full((4,), 5.0, dtype=F64))
    w_dg, _ = GATES["delight"](x, GateConfig("delight"))
    for name in ("uncertainty_shift", "uncertainty_shrink", "entropy_guard", "freshness"):
        w, _ = GATES[name](x, GateConfig(name))
        assert not torch.allclose(w, w_dg), name
    w, stats = GATES["uncertainty_filter"](x, GateConfig("uncertainty_filter", tau=0.2))
    assert torch.equal(w, torch.zeros_like(w))
    assert torch.equal(stats["kept_frac"], torch.zeros_like(w))


def test_filtered_dg_above_every_std_trains_exactly_like_dg(tmp_path: Path) -> None:
    """Through the real loop: rewards lie in [0, 1], so their std never exceeds 1/2; with
    τ = 0.6 no sample is ever dropped and filtered_dg's run equals dg's bit for bit (the same
    losses, the same evaluations, the same final parameters)."""
    runs = {}
    for method, components in (("dg", MethodConfig()),
                               ("filtered_dg", MethodConfig(filter_tau=0.6))):
        cfg = TrainConfig(method=method, components=components,
                          task_options=TaskConfig(seq_len=4, eval_batches=1, eval_batch_size=16),
                          run=RunConfig(batch_size=16, num_steps=6, eval_every=3, progress=False,
                                        device="cpu", runs_dir=str(tmp_path), name=method,
                                        log_samples=0))
        runs[method] = train(cfg)
    dg, filtered = runs["dg"], runs["filtered_dg"]
    for a, b in zip(dg.metrics, filtered.metrics, strict=True):
        assert a["loss/policy"] == b["loss/policy"]
        assert a["policy/gate_mean"] == b["policy/gate_mean"]
        assert b["policy/kept_frac"] == 1.0
    assert [e["eval/test_error"] for e in dg.evals] == \
        [e["eval/test_error"] for e in filtered.evals]
    state_dg = torch.load(dg.run_dir / "checkpoints" / "step_6.pt", weights_only=True)
    state_f = torch.load(filtered.run_dir / "checkpoints" / "step_6.pt", weights_only=True)
    for key, value in state_dg["policy"].items():
        assert torch.equal(value, state_f["policy"][key]), key
