"""dsv32 (METHODS_2026.md §3): the opsm gate and the is_corrected KL estimator — worked
examples by hand, the identities, validation, and the preset through the loop."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from fp64 import F64, TOL
from fp64 import t as _t

from rlscope.config import ConfigError, RunConfig, TrainConfig, correction_warnings, validate
from rlscope.methods import METHODS, MethodConfig
from rlscope.methods.gates import GATES, GateInputs
from rlscope.methods.regularizers import kl_estimate, kl_is_corrected
from rlscope.methods.spec import GateConfig
from rlscope.metrics.estimators import pass_metrics
from rlscope.replay import ReplayConfig
from rlscope.sampling import SamplingConfig
from rlscope.tasks import TaskConfig
from rlscope.train import RunResult, train


def _opsm(adv: list[list[float]], logp: list[list[float]], logp_s: list[list[float]],
          delta: float = 0.5, mask: list[list[float]] | None = None
          ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    m = _t(mask) if mask is not None else torch.ones_like(_t(adv))
    x = GateInputs(_t(adv), _t(logp), logp_sampler_BT=_t(logp_s), mask_BT=m)
    return GATES["opsm"](x, GateConfig("opsm", opsm_delta=delta))


def test_opsm_worked_example() -> None:
    """ℓ_s = (−1, −2), ℓ = (−1.5, −3): D = 0.75 > 0.5: the row is dropped if A < 0, kept if
    A > 0; the metrics are per row."""
    logp, logp_s = [[-1.5, -3.0]] * 2, [[-1.0, -2.0]] * 2
    w, stats = _opsm([[-1.0, -1.0], [2.0, 2.0]], logp, logp_s)
    torch.testing.assert_close(w, _t([[0.0, 0.0], [2.0, 2.0]]), **TOL)
    torch.testing.assert_close(stats["gate/opsm_D_mean"], _t([[0.75, 0.75]] * 2), **TOL)
    m = pass_metrics(_t(logp), _t(logp), torch.ones(2, 2, dtype=F64), stats, "")
    assert m["gate/opsm_masked_seq_frac"].item() == 0.5
    assert abs(m["gate/opsm_D_mean"].item() - 0.75) < 1e-12


def test_opsm_rows_use_their_own_valid_tokens() -> None:
    """D_i is a mean over the row's valid tokens; the sequence fraction counts rows, not
    tokens (row 1: one token, D = 1; row 2: three tokens, D = 0.2)."""
    w, stats = _opsm([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]],
                     [[-2.0, 0.0, 0.0], [-1.2, -1.2, -1.2]],
                     [[-1.0, -5.0, -5.0], [-1.0, -1.0, -1.0]], mask=[[1, 0, 0], [1, 1, 1]])
    torch.testing.assert_close(w, _t([[0.0, 0.0, 0.0], [-1.0, -1.0, -1.0]]), **TOL)
    mask = _t([[1, 0, 0], [1, 1, 1]])
    m = pass_metrics(_t([[0.0] * 3] * 2), _t([[0.0] * 3] * 2), mask, stats, "")
    assert m["gate/opsm_masked_seq_frac"].item() == 0.5  # token-weighted would be 0.25
    assert abs(m["gate/opsm_D_mean"].item() - 0.6) < 1e-12


def test_opsm_identities() -> None:
    """ℓ_s = ℓ gives D = 0 and w = A; δ → ∞ gives w = A (the gate `none`, i.e. grpo)."""
    g = torch.Generator().manual_seed(0)
    adv = torch.randn(4, 5, generator=g, dtype=F64)
    logp = -torch.rand(4, 5, generator=g, dtype=F64)
    w, stats = _opsm(adv.tolist(), logp.tolist(), logp.tolist())
    assert torch.equal(w, adv) and torch.equal(stats["gate/opsm_D_mean"], torch.zeros_like(adv))
    w, _ = _opsm(adv.tolist(), logp.tolist(), (logp + 3.0).tolist(), delta=1e9)
    assert torch.equal(w, GATES["none"](GateInputs(adv, logp), GateConfig())[0])
    w, _ = _opsm(adv.tolist(), logp.tolist(), (logp + 3.0).tolist())
    row_neg = adv.mean(-1) < 0
    assert torch.equal(w[row_neg], torch.zeros_like(w[row_neg]))
    assert torch.equal(w[~row_neg], adv[~row_neg])


def test_is_corrected_kl_worked_example_and_gradient() -> None:
    """p = 0.5, p_ref = 0.25, p_μ = 0.4: k3 = 0.193147, ρ = 1.25, KL_t = 0.241434,
    ∂KL_t/∂ℓ = ρ(ℓ − ℓ_ref) = 0.866434 (ρ is not detached)."""
    logp = torch.tensor([[math.log(0.5)]], dtype=F64, requires_grad=True)
    ref, old = _t([[math.log(0.25)]]), _t([[math.log(0.4)]])
    kl = kl_is_corrected(logp, ref, old)
    assert abs(kl_estimate(logp, ref, "k3").item() - 0.193147) < 1e-6
    assert abs(kl.item() - 0.241434) < 1e-6
    (grad,) = torch.autograd.grad(kl.sum(), logp)
    assert abs(grad.item() - 0.866434) < 1e-6


def test_is_corrected_identities() -> None:
    """∂(ρ·k3)/∂ℓ = ρ·(ℓ − ℓ_ref) on random tokens; at ρ = 1 the value is k3."""
    g = torch.Generator().manual_seed(1)
    logp = (-torch.rand(3, 4, generator=g, dtype=F64) * 3).requires_grad_()
    ref = -torch.rand(3, 4, generator=g, dtype=F64) * 3
    old = -torch.rand(3, 4, generator=g, dtype=F64) * 3
    (grad,) = torch.autograd.grad(kl_is_corrected(logp, ref, old).sum(), logp)
    l_d = logp.detach()
    torch.testing.assert_close(grad, (l_d - old).exp() * (l_d - ref), **TOL)
    torch.testing.assert_close(kl_is_corrected(l_d, ref, l_d), kl_estimate(l_d, ref, "k3"),
                               **TOL)


def _cfg(method: str, components: MethodConfig | None = None, group_size: int = 4,
         **options: object) -> TrainConfig:
    return TrainConfig(method=method, components=components or MethodConfig(),
                       task_options=TaskConfig(seq_len=4, eval_batches=1, eval_batch_size=4),
                       run=RunConfig(batch_size=8, group_size=group_size),
                       **options)  # type: ignore[arg-type]


def test_preset_settings() -> None:
    spec = METHODS["dsv32"]
    assert (spec.gate.name, spec.gate.opsm_delta) == ("opsm", 0.5)
    assert (spec.kl.estimator, spec.kl.target, spec.kl.place, spec.kl.coef) == \
        ("is_corrected", "ref", "loss", 0.001)
    assert spec.needs_reference and spec.objective.name == "ppo_clip"
    assert spec.advantage == METHODS["grpo"].advantage


@pytest.mark.parametrize(("components", "group_size", "message"), [
    (MethodConfig(opsm_delta=0.0), 4, "method.opsm_delta=0.0 must be > 0"),
    (MethodConfig(kl_target="behaviour"), 4, "method.kl_estimator='is_corrected' needs "
     "kl_target='ref'"),
    (MethodConfig(kl_place="reward"), 4, "kl_place='loss'"),
    (MethodConfig(), 1, "group_size must be > 1"),
])
def test_rejected_outside_its_regime(components: MethodConfig, group_size: int,
                                     message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        validate(_cfg("dsv32", components, group_size))


def test_warns_when_the_learner_samples() -> None:
    """§4: with the learner sampling on-policy ℓ_s = ℓ: a warning, not an error; none with
    staleness (a real mismatch)."""
    spec, _, _ = validate(_cfg("dsv32"))
    (warning,) = correction_warnings(_cfg("dsv32"), spec)
    assert "method 'dsv32'" in warning and "gate='opsm'" in warning
    assert correction_warnings(_cfg("dsv32", replay=ReplayConfig(replay_capacity=4)), spec) == []


def _run(tmp_path: Path, name: str, components: MethodConfig, steps: int = 2) -> RunResult:
    return train(TrainConfig(
        method="dsv32", components=components,
        task_options=TaskConfig(vocab=4, seq_len=4, eval_batches=1, eval_batch_size=8),
        sampling=SamplingConfig(use_cache=False),
        run=RunConfig(num_steps=steps, batch_size=16, group_size=4, eval_every=0, name=name,
                      progress=False, device="cpu", runs_dir=str(tmp_path))))


def test_on_policy_opsm_is_the_identity_through_the_loop(tmp_path: Path) -> None:
    """The uncached sampler gives ℓ_s = ℓ_o exactly, so with one inner epoch D = 0 and dsv32
    equals its `--gate none` ablation (grpo with the is_corrected KL) bit for bit."""
    masked = _run(tmp_path, "opsm", MethodConfig())
    plain = _run(tmp_path, "none", MethodConfig(gate="none"))
    assert [r["loss/total"] for r in masked.metrics] == [r["loss/total"] for r in plain.metrics]
    row = masked.metrics[0]
    assert row["gate/opsm_masked_seq_frac"] == 0 and row["gate/opsm_D_mean"] == 0
    assert row["policy/kl_ref_is"] == pytest.approx(row["policy/kl_ref_k3"], abs=1e-6)


def test_opsm_acts_on_a_sampler_learner_mismatch(tmp_path: Path) -> None:
    """Top-2 of 4 symbols without replaying the kept set: the sampler's renormalised ℓ_s sits
    above the learner's full-softmax ℓ, so D_i > 0 on every row and, with a small δ, rows
    with A < 0 are dropped (and only those: about half the rows of mixed groups)."""
    row = train(TrainConfig(
        method="dsv32", components=MethodConfig(opsm_delta=0.05), task_options=TaskConfig(
            vocab=4, seq_len=4, eval_batches=1, eval_batch_size=8),
        sampling=SamplingConfig(top_k=2, replay_sampling_mask=False),
        run=RunConfig(num_steps=1, batch_size=16, group_size=4, eval_every=0, name="mm",
                      progress=False, device="cpu", runs_dir=str(tmp_path)))).metrics[0]
    assert row["gate/opsm_D_mean"] > 0.05
    assert 0 < row["gate/opsm_masked_seq_frac"] < 1


def test_micro_batching_leaves_the_update_unchanged(tmp_path: Path) -> None:
    """D_i is a per-row quantity of the current pass: micro-batches of 1 row and of the whole
    batch give the same losses (to float rounding)."""
    def run(micro: int) -> list[float]:
        return [r["loss/total"] for r in train(TrainConfig(
            method="dsv32", components=MethodConfig(opsm_delta=0.05),
            task_options=TaskConfig(vocab=4, seq_len=4, eval_batches=1, eval_batch_size=8),
            sampling=SamplingConfig(top_k=2, replay_sampling_mask=False),
            run=RunConfig(num_steps=2, batch_size=8, group_size=4, eval_every=0,
                          micro_batch_size=micro, name=f"mb{micro}", progress=False,
                          device="cpu", runs_dir=str(tmp_path)))).metrics]
    assert run(1) == pytest.approx(run(8), abs=1e-6)


def test_d_uses_the_current_policy_at_every_pass(tmp_path: Path) -> None:
    """ℓ_s = ℓ_o exactly (uncached sampler), so D = 0 on the first pass; the last of two inner
    epochs reads the moved policy, so its D is not 0."""
    row = train(TrainConfig(
        method="dsv32", task_options=TaskConfig(vocab=4, seq_len=4, eval_batches=1,
                                                eval_batch_size=8),
        sampling=SamplingConfig(use_cache=False),
        run=RunConfig(num_steps=1, batch_size=16, group_size=4, inner_epochs=2, eval_every=0,
                      name="epochs", progress=False, device="cpu",
                      runs_dir=str(tmp_path)))).metrics[0]
    assert row["gate/opsm_D_mean"] != 0
