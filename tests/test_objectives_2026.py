"""METHODS_2026.md §3 objectives and batch-wide selections: worked examples (values and
gradients), identities, validation, micro-batch invariance and 20-step runs of gspo_token,
gmpo, intellect2, dppo_tv, dppo_kl, clip_cov, kl_cov and dapo_forking."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from rlscope.config import ConfigError, DiagnosticsConfig, RunConfig, TrainConfig, validate
from rlscope.methods import MethodConfig
from rlscope.methods.aggregation import aggregate
from rlscope.methods.batch_stats import (
    BatchStatInputs,
    clip_cov_select,
    entropy_top_select,
    kl_cov_select,
)
from rlscope.methods.configs import GateConfig, ObjectiveConfig
from rlscope.methods.gates import GATES, GateInputs
from rlscope.methods.objectives import OBJECTIVES, PolicyTerms
from rlscope.methods.presets import METHODS
from rlscope.metrics.estimators import pass_metrics
from rlscope.metrics.schema import unregistered
from rlscope.policy import ModelConfig
from rlscope.tasks import TaskConfig
from rlscope.train import train

D = torch.float64


def t(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=D)


def _loss_and_grad(name: str, logp_old: torch.Tensor, d: torch.Tensor, adv: torch.Tensor,
                   agg: str, cfg: ObjectiveConfig | None = None,
                   select: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The aggregated loss and its gradient w.r.t. ℓ at ℓ = ℓ_μ + d."""
    logp = (logp_old + d).requires_grad_(True)
    mask = torch.ones_like(logp)
    if cfg is None:
        cfg = METHODS[name].objective if name in METHODS else ObjectiveConfig(name)
    loss_BT, _ = OBJECTIVES[cfg.name](PolicyTerms(logp, logp_old, adv, mask, select_BT=select),
                                      cfg)
    loss = aggregate(loss_BT, mask, agg, mask.sum(), float(mask.shape[0]), mask.shape[1])
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), grad


# --- gspo_token -------------------------------------------------------------------------

def test_gspo_token_worked_example_per_token_gradients() -> None:
    """d = (0.1, −0.1) → s = 1, A = (1, −1): gradients −1/2 and +1/2; gspo's is zero."""
    old, d, adv = t([-1.0, -2.0]), t([0.1, -0.1]), t([1.0, -1.0])
    _, g = _loss_and_grad("gspo_token", old, d, adv, "seq_mean_token_mean")
    torch.testing.assert_close(g, t([-0.5, 0.5]))
    _, g_gspo = _loss_and_grad("gspo", old, d, adv, "seq_mean_token_mean")
    torch.testing.assert_close(g_gspo, t([0.0, 0.0]))


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
def test_gspo_token_equals_gspo_with_a_constant_advantage_per_row(agg: str) -> None:
    old = t([-1.0, -2.0, -0.5], [-0.3, -1.2, -2.2])
    d = t([0.02, -0.01, 0.03], [-0.2, 0.1, 0.05])
    adv = t([1.5, 1.5, 1.5], [-0.7, -0.7, -0.7])
    cfg = ObjectiveConfig("gspo", clip_low=0.05, clip_high=0.08)
    loss_g, g_gspo = _loss_and_grad("gspo", old, d, adv, agg, cfg)
    loss_t, g_tok = _loss_and_grad("gspo_token", old, d, adv, agg,
                                   dataclasses.replace(cfg, name="gspo_token"))
    torch.testing.assert_close(loss_t, loss_g)
    torch.testing.assert_close(g_tok, g_gspo)


# --- gmpo -------------------------------------------------------------------------------

def test_gmpo_worked_examples() -> None:
    """A = 1, d = (0.5, −0.1): d̃ = (0.4, −0.1), L = −e^0.15, only token 2 gets gradient
    (−e^0.15/2). A = −1, d = (0.5, −0.6): d̃ = (0.5, −0.4), L = e^0.05."""
    old = t([-1.0, -2.0])
    loss, g = _loss_and_grad("gmpo", old, t([0.5, -0.1]), t([1.0, 1.0]), "seq_mean_token_sum")
    assert loss.item() == pytest.approx(-1.161834, abs=1e-6)
    torch.testing.assert_close(g, t([0.0, -math.exp(0.15) / 2]))
    loss, g = _loss_and_grad("gmpo", old, t([0.5, -0.6]), t([-1.0, -1.0]), "seq_mean_token_sum")
    assert loss.item() == pytest.approx(1.051271, abs=1e-6)
    torch.testing.assert_close(g, t([math.exp(0.05) / 2, 0.0]))
    x = PolicyTerms(old + t([0.5, -0.6]), old, t([-1.0, -1.0]), torch.ones(1, 2, dtype=D))
    _, stats = OBJECTIVES["gmpo"](x, METHODS["gmpo"].objective)
    assert stats["clipfrac_low"].tolist() == [[0.0, 1.0]]
    assert stats["clipfrac_high"].tolist() == [[0.0, 0.0]]


def test_gmpo_on_policy_gradient_equals_grpo_with_sequence_mean() -> None:
    old = t([-1.0, -2.0, -0.5], [-0.3, -1.2, -2.2])
    adv = t([1.5, 1.5, 1.5], [-0.7, -0.7, -0.7])
    zero = torch.zeros_like(old)
    _, g = _loss_and_grad("gmpo", old, zero, adv, "seq_mean_token_sum")
    _, g_ppo = _loss_and_grad("ppo_clip", old, zero, adv, "seq_mean_token_mean",
                              ObjectiveConfig("ppo_clip"))
    torch.testing.assert_close(g, g_ppo)


def test_gmpo_one_token_sequences_equal_ppo_clip_with_the_mapped_bounds() -> None:
    """One token: exp(clip_log(d)) = clip(ρ, e^−0.4, e^0.4), i.e. ppo_clip with ε_low =
    1 − e^−0.4 = 0.32968, ε_high = e^0.4 − 1 = 0.49182 (values and gradients, off-policy)."""
    old = t([-1.0], [-0.5], [-2.0], [-0.2])
    d = t([0.6], [-0.7], [0.2], [-0.1])
    adv = t([1.0], [-1.0], [-2.0], [0.5])
    loss, g = _loss_and_grad("gmpo", old, d, adv, "seq_mean_token_sum")
    cfg = ObjectiveConfig("ppo_clip", clip_low=1 - math.exp(-0.4), clip_high=math.exp(0.4) - 1)
    assert cfg.clip_low == pytest.approx(0.32968, abs=1e-5)
    assert cfg.clip_high == pytest.approx(0.49182, abs=1e-5)
    loss_ppo, g_ppo = _loss_and_grad("ppo_clip", old, d, adv, "seq_mean_token_sum", cfg)
    torch.testing.assert_close(loss, loss_ppo)
    torch.testing.assert_close(g, g_ppo)


# --- intellect2 -------------------------------------------------------------------------

def test_intellect2_dual_clip_worked_example() -> None:
    """A = −1, ρ = 5: PPO loss 5 with gradient, intellect2 4 without; ρ = 3: 3 in both."""
    old = t([-2.0])
    ppo = ObjectiveConfig("ppo_clip")
    for rho, want, grad_zero in ((5.0, 4.0, True), (3.0, 3.0, False)):
        d = t([math.log(rho)])
        loss, g = _loss_and_grad("intellect2", old, d, t([-1.0]), "token_mean",
                                 METHODS["intellect2"].objective)
        loss_ppo, g_ppo = _loss_and_grad("ppo_clip", old, d, t([-1.0]), "token_mean", ppo)
        assert loss.item() == pytest.approx(want)
        assert loss_ppo.item() == pytest.approx(rho)
        assert (g.abs().sum().item() == 0) is grad_zero
        assert g_ppo.item() == pytest.approx(rho)


def test_intellect2_with_an_infinite_dual_clip_is_grpo_with_kl_to_ref() -> None:
    old = t([-2.0, -1.0])
    d, adv = t([math.log(7.0), -0.1]), t([-1.0, -1.0])
    spec = METHODS["intellect2"]
    assert (spec.kl.target, spec.kl.coef, spec.kl.estimator) == ("ref", 0.001, "k3")
    far = dataclasses.replace(spec.objective, dual_clip=1e9)
    loss, g = _loss_and_grad("ppo_clip", old, d, adv, "token_mean", far)
    loss_grpo, g_grpo = _loss_and_grad("ppo_clip", old, d, adv, "token_mean",
                                       METHODS["grpo"].objective)
    torch.testing.assert_close(loss, loss_grpo)
    torch.testing.assert_close(g, g_grpo)


# --- dppo -------------------------------------------------------------------------------

def _dppo_stats(name: str, p_mu: float, p: float, adv: float) -> dict[str, torch.Tensor]:
    old = t([math.log(p_mu)])
    x = PolicyTerms(t([math.log(p)]), old, t([adv]), torch.ones(1, 1, dtype=D))
    return OBJECTIVES[name](x, METHODS[name].objective)[1]


def test_dppo_masked_fractions_are_over_the_tokens_with_nonzero_advantage() -> None:
    """Four valid tokens, p_μ = 0.5 → p = 0.7 everywhere (TV 0.2 > δ): A = (1, 1, 0, −1).
    Tokens 1 and 2 (A > 0) are masked; token 3 has A = 0 and is outside the population; token
    4 (A < 0, p rose) is kept. masked_frac_pos = 2/3 and masked_frac_neg = 0 over the three
    tokens with A ≠ 0 (over all four valid tokens it would read 1/2); the padded token 5 counts
    nowhere."""
    old_BT = torch.full((1, 5), math.log(0.5), dtype=D)
    logp_BT = torch.full((1, 5), math.log(0.7), dtype=D)
    mask_BT = t([1.0, 1.0, 1.0, 1.0, 0.0])
    x = PolicyTerms(logp_BT, old_BT, t([1.0, 1.0, 0.0, -1.0, 1.0]), mask_BT)
    _, stats = OBJECTIVES["dppo_tv"](x, METHODS["dppo_tv"].objective)
    assert torch.isnan(stats["masked_frac_pos"][0, 2])
    m = pass_metrics(logp_BT, old_BT, mask_BT, stats, "")
    assert m["policy/masked_frac_pos"].item() == pytest.approx(2 / 3)
    assert m["policy/masked_frac_neg"].item() == 0.0
    assert math.isfinite(m["policy/tv_mean"].item())


def test_dppo_worked_examples() -> None:
    """p_μ = 0.5, p = 0.7, A > 0: TV 0.2 > 0.15 masked; K = 0.087177 > 0.05 masked.
    p_μ = 0.01, p = 0.05: TV 0.04, K = 0.024736: kept."""
    tv, kl = _dppo_stats("dppo_tv", 0.5, 0.7, 1.0), _dppo_stats("dppo_kl", 0.5, 0.7, 1.0)
    assert kl["binary_kl_mean"].item() == pytest.approx(0.087177, abs=1e-6)
    assert tv["tv_mean"].item() == pytest.approx(0.2)
    assert tv["masked_frac_pos"].item() == 1.0 and kl["masked_frac_pos"].item() == 1.0
    tv, kl = _dppo_stats("dppo_tv", 0.01, 0.05, 1.0), _dppo_stats("dppo_kl", 0.01, 0.05, 1.0)
    assert kl["binary_kl_mean"].item() == pytest.approx(0.024736, abs=1e-6)
    assert tv["masked_frac_pos"].item() == 0.0 and kl["masked_frac_pos"].item() == 0.0
    # the kept token's gradient is −A·min(ρ, 10) = −5 (ρ = 5; PPO ε_high 0.28 would clip it)
    for name in ("dppo_tv", "dppo_kl"):
        _, g = _loss_and_grad(name, t([math.log(0.01)]), t([math.log(5.0)]), t([1.0]),
                              "token_mean", METHODS[name].objective)
        assert g.item() == pytest.approx(-5.0)
    # A < 0 moving p down out of the region is masked: zero gradient
    _, g = _loss_and_grad("dppo_tv", t([math.log(0.5)]), t([math.log(0.3 / 0.5)]), t([-1.0]),
                          "token_mean", METHODS["dppo_tv"].objective)
    assert g.item() == 0.0


@pytest.mark.parametrize("name", ["dppo_tv", "dppo_kl"])
def test_dppo_first_pass_is_dr_grpo_policy_gradient(name: str) -> None:
    old = t([-1.0, -2.0, -0.5], [-0.3, -1.2, -2.2])
    adv, zero = t([0.5, 0.5, 0.5], [-0.5, -0.5, -0.5]), torch.zeros_like(old)
    _, g = _loss_and_grad(name, old, zero, adv, "seq_mean_token_sum_norm",
                          METHODS[name].objective)
    _, g_dr = _loss_and_grad("ppo_clip", old, zero, adv, "seq_mean_token_sum_norm",
                             METHODS["dr_grpo"].objective)
    torch.testing.assert_close(g, g_dr)
    # δ, c → ∞: the uncapped IS policy gradient −A·ρ·∇ℓ off-policy
    d = t([0.9, -0.4, 0.3], [-1.5, 0.2, 0.0])
    wide = dataclasses.replace(METHODS[name].objective, dppo_delta_low=0.999999,
                               dppo_delta_high=0.999999 if name == "dppo_tv" else 1e9,
                               cap=1e9)
    if name == "dppo_kl":
        wide = dataclasses.replace(wide, dppo_delta_low=1e9)
    _, g = _loss_and_grad(name, old, d, adv, "token_mean", wide)
    torch.testing.assert_close(g, -adv * d.exp() / 6)


# --- clip_cov, kl_cov -------------------------------------------------------------------

_ELL = t([-0.1, -2.0, -0.5, -1.0])


def _stat_inputs(adv: torch.Tensor, logp: torch.Tensor, d: torch.Tensor | None = None,
                 entropy: torch.Tensor | None = None) -> BatchStatInputs:
    return BatchStatInputs(adv_BT=adv, logp_BT=logp,
                           logp_old_BT=logp - (torch.zeros_like(logp) if d is None else d),
                           entropy_BT=torch.zeros_like(logp) if entropy is None else entropy,
                           mask_BT=torch.ones_like(logp),
                           generator=torch.Generator().manual_seed(0))


def test_kl_cov_worked_example() -> None:
    """A = (1, 1, −1, −1), ℓ = (−0.1, −2, −0.5, −1): C = (0.8, −1.1, −0.4, 0.1); token 1
    selected (k = 1); with d_1 = 0.1 its loss is −e^0.1 + 0.1 = −1.005171."""
    adv, d = t([1.0, 1.0, -1.0, -1.0]), t([0.1, 0.0, 0.0, 0.0])
    cfg = METHODS["kl_cov"].objective
    select, m = kl_cov_select(_stat_inputs(adv, _ELL, d), cfg)
    assert select.tolist() == [[1.0, 0.0, 0.0, 0.0]]
    assert m["cov/selected_mean"].item() == pytest.approx(0.8)
    assert m["cov/selected_frac"].item() == 0.25
    logp = (_ELL).clone().requires_grad_(True)
    loss_BT, _ = OBJECTIVES["kl_cov"](PolicyTerms(logp, _ELL - d, adv, torch.ones_like(logp),
                                                  select_BT=select), cfg)
    assert loss_BT[0, 0].item() == pytest.approx(-1.005171, abs=1e-6)
    (g,) = torch.autograd.grad(loss_BT[0, 0], logp)
    assert g[0, 0].item() == pytest.approx(-math.exp(0.1) + 1.0)


def test_clip_cov_worked_example_and_detached_token() -> None:
    """A = (2, 2, −2, −2), same ℓ, ρ = 1: C = (1.6, −2.2, −0.8, 0.2); only token 1 is in
    (1, 5); it is selected and gets no gradient."""
    adv = t([2.0, 2.0, -2.0, -2.0])
    cfg = METHODS["clip_cov"].objective
    select, m = clip_cov_select(_stat_inputs(adv, _ELL), cfg)
    assert select.tolist() == [[1.0, 0.0, 0.0, 0.0]]
    assert m["cov/mean"].item() == pytest.approx((1.6 - 2.2 - 0.8 + 0.2) / 4)
    _, g = _loss_and_grad("clip_cov", _ELL, torch.zeros_like(_ELL), adv, "token_mean", cfg,
                          select)
    torch.testing.assert_close(g, t([0.0, -0.5, 0.5, 0.5]))


def test_cov_identities() -> None:
    """All A equal (C ≡ 0, no candidate): clip_cov = ppo_clip ε 1/1; kl_cov with β = 0 is the
    unclipped surrogate −Aρ."""
    adv, d = t([1.0, 1.0, 1.0, 1.0]), t([0.9, -0.3, 1.2, 0.1])
    cfg = METHODS["clip_cov"].objective
    select, m = clip_cov_select(_stat_inputs(adv, _ELL + d, d), cfg)
    assert select.sum().item() == 0 and m["cov/selected_frac"].item() == 0
    loss, g = _loss_and_grad("clip_cov", _ELL, d, adv, "token_mean", cfg, select)
    ppo = ObjectiveConfig("ppo_clip", clip_low=1.0, clip_high=1.0)
    loss_ppo, g_ppo = _loss_and_grad("ppo_clip", _ELL, d, adv, "token_mean", ppo)
    assert torch.equal(loss, loss_ppo) and torch.equal(g, g_ppo)
    adv = t([1.0, -2.0, 0.5, 1.0])
    kl0 = dataclasses.replace(METHODS["kl_cov"].objective, kl_cov_coef=0.0)
    loss, g = _loss_and_grad("kl_cov", _ELL, d, adv, "token_mean", kl0, torch.ones_like(d))
    torch.testing.assert_close(loss, -(adv * d.exp()).mean())
    torch.testing.assert_close(g, -adv * d.exp() / 4)


def test_clip_cov_skips_tokens_whose_clipped_branch_is_active() -> None:
    """Token 1 has C = 1.6 in the window but ρ = e^0.9 > 1 + ε_high 0.5 with A > 0: not a
    candidate, so nothing is selected."""
    adv = t([2.0, 2.0, -2.0, -2.0])
    cfg = dataclasses.replace(METHODS["clip_cov"].objective, clip_low=0.5, clip_high=0.5)
    d = t([0.9, 0.0, 0.0, 0.0])
    select, _ = clip_cov_select(_stat_inputs(adv, _ELL, d), cfg)
    assert select.sum().item() == 0


# --- entropy_top / dapo_forking ---------------------------------------------------------

def test_entropy_top_worked_example() -> None:
    """H = (0.1, …, 1.0), ρ_H = 0.2: τ = 0.82; tokens with H 0.9 and 1.0 keep their A; the
    token_mean denominator stays 10."""
    h = torch.arange(1, 11, dtype=D)[None] / 10
    adv = torch.ones_like(h)
    select, m = entropy_top_select(_stat_inputs(adv, -h, entropy=h),
                                   METHODS["dapo_forking"].gate)
    assert m["gate/entropy_threshold"].item() == pytest.approx(0.82)
    assert m["gate/kept_frac"].item() == 0.2
    w, _ = GATES["entropy_top"](GateInputs(adv, -h, select_BT=select),
                                METHODS["dapo_forking"].gate)
    assert w.tolist() == [[0.0] * 8 + [1.0, 1.0]]
    loss = aggregate(w, torch.ones_like(w), "token_mean", torch.tensor(10.0), 1.0, 10)
    assert loss.item() == pytest.approx(0.2)


def test_entropy_top_with_rho_one_is_no_gate() -> None:
    h = torch.rand(3, 5, dtype=D, generator=torch.Generator().manual_seed(1))
    adv = torch.randn(3, 5, dtype=D, generator=torch.Generator().manual_seed(2))
    cfg = GateConfig("entropy_top", entropy_top_frac=1.0)
    select, _ = entropy_top_select(_stat_inputs(adv, -h, entropy=h), cfg)
    w, _ = GATES["entropy_top"](GateInputs(adv, -h, select_BT=select), cfg)
    assert torch.equal(w, adv)


# --- validation ---------------------------------------------------------------------------

def _cfg(method: str, components: MethodConfig | None = None, group_size: int = 4
         ) -> TrainConfig:
    return TrainConfig(method=method, components=components or MethodConfig(),
                       task_options=TaskConfig(seq_len=4, eval_batches=1, eval_batch_size=4),
                       run=RunConfig(batch_size=8, group_size=group_size))


PRESETS = ["gspo_token", "gmpo", "intellect2", "dppo_tv", "dppo_kl", "clip_cov", "kl_cov",
           "dapo_forking"]


@pytest.mark.parametrize("method", PRESETS)
def test_presets_validate_and_need_groups(method: str) -> None:
    spec, _, _ = validate(_cfg(method))
    assert spec == METHODS[method]
    with pytest.raises(ConfigError, match=r"run\.group_size=1"):
        validate(_cfg(method, group_size=1))


@pytest.mark.parametrize(("method", "components", "message"), [
    ("gmpo", MethodConfig(clip_low=0.0), "method.clip_low=0.0 and method.clip_high=0.4 are "
     "gmpo's log-space bounds"),
    ("gmpo", MethodConfig(agg="token_mean"), "method.agg='token_mean': objective 'gmpo'"),
    ("dppo_tv", MethodConfig(dppo_delta_high=1.0), "method.dppo_delta_low=0.15 and "
     r"method.dppo_delta_high=1.0 bound a total variation: both must lie in \(0, 1\)"),
    ("dppo_kl", MethodConfig(dppo_delta_low=0.0), "method.dppo_delta_low=0.0"),
    ("clip_cov", MethodConfig(clip_cov_ratio=1.0), "method.clip_cov_ratio=1.0"),
    ("clip_cov", MethodConfig(clip_cov_low=5.0), "method.clip_cov_low=5.0 must be < "
     "method.clip_cov_high=5.0"),
    ("kl_cov", MethodConfig(kl_cov_ratio=0.0), "method.kl_cov_ratio=0.0 must lie"),
    ("kl_cov", MethodConfig(kl_cov_coef=-1.0), "method.kl_cov_coef=-1.0 must be >= 0"),
    ("dapo_forking", MethodConfig(entropy_top_frac=0.0), "method.entropy_top_frac=0.0"),
    ("intellect2", MethodConfig(dual_clip=1.1), r"method.dual_clip=1.1 must be > 1 \+ "
     "clip_high"),
    ("clip_cov", MethodConfig(gate="entropy_top"), "both select tokens over the batch"),
])
def test_out_of_regime_settings_are_rejected_naming_the_flag(
        method: str, components: MethodConfig, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        validate(_cfg(method, components))


# --- micro-batch invariance and runs ------------------------------------------------------

def _train(tmp_path: Path, method: str, name: str, steps: int, micro: int = 0,
           **components: float) -> tuple[list[dict[str, float]], dict[str, torch.Tensor]]:
    result = train(TrainConfig(
        method=method, model=ModelConfig(dtype="float64"),
        components=MethodConfig(**components),  # type: ignore[arg-type]
        task_options=TaskConfig(vocab=4, seq_len=4, eval_batches=1, eval_batch_size=4),
        run=RunConfig(num_steps=steps, batch_size=8, group_size=4, micro_batch_size=micro,
                      inner_epochs=2, num_minibatches=2, eval_every=0, name=name,
                      progress=False, device="cpu", runs_dir=str(tmp_path))))
    params = torch.load(result.run_dir / "checkpoints" / f"step_{steps}.pt",
                        weights_only=True)["policy"]
    return result.metrics, params


@pytest.mark.parametrize(("method", "micro", "components"), [
    ("clip_cov", 1, {"clip_cov_ratio": 0.1, "clip_cov_low": 0.0, "clip_cov_high": 100.0}),
    ("kl_cov", 4, {"kl_cov_ratio": 0.1}),
    ("dapo_forking", 1, {}),
])
def test_batch_selection_is_micro_batch_invariant(tmp_path: Path, method: str, micro: int,
                                                  components: dict[str, float]) -> None:
    """Micro-batches of ``micro`` rows and the whole minibatch select the same tokens (same
    metrics at every step) and give the same update (fp64, to accumulation rounding).

    kl_cov is compared at 4 rows (whole groups, the same forward path): its β|ℓ − ℓ_μ| has a
    kink at d = 0, where every token sits on the first pass, so the rounding-level d of
    another forward path (1 row: no shared prompt) flips the sign of its gradient. Its
    selection is still the same at 1 row (checked on the first step)."""
    m_full, p_full = _train(tmp_path, method, f"{method}_full", 3, 0, **components)
    m_mb, p_mb = _train(tmp_path, method, f"{method}_mb", 3, micro, **components)
    keys = [k for k in m_full[0] if k.startswith(("cov/", "gate/"))]
    assert keys
    for row_full, row_mb in zip(m_full, m_mb, strict=True):
        for k in keys:
            assert row_mb[k] == pytest.approx(row_full[k], abs=1e-12), k
    if method != "dapo_forking":
        assert any(row["cov/selected_frac"] > 0 for row in m_full)
    for k, v in p_full.items():
        torch.testing.assert_close(p_mb[k], v, atol=1e-10, rtol=0, msg=k)
    if micro > 1:
        m_one, _ = _train(tmp_path, method, f"{method}_one", 1, 1, **components)
        for k in keys:
            assert m_one[0][k] == pytest.approx(m_full[0][k], abs=1e-12), k


@pytest.mark.parametrize("method", PRESETS)
def test_presets_run_twenty_steps_with_finite_metrics(tmp_path: Path, method: str) -> None:
    metrics, _ = _train(tmp_path, method, method, 20)
    assert len(metrics) == 20
    for row in metrics:
        bad = [k for k, v in row.items() if isinstance(v, float) and not math.isfinite(v)]
        assert not bad, bad
        assert unregistered(row) == []
    if METHODS[method].needs_batch_statistic:
        prefix = "gate/" if method == "dapo_forking" else "cov/"
        assert any(k.startswith(prefix) for k in metrics[-1])


def test_gradient_diagnostics_use_the_batch_selection(tmp_path: Path) -> None:
    """--grad_diagnostics computes the method's gradient with the first optimizer step's
    selection (the objective would otherwise have no select_BT)."""
    result = train(TrainConfig(
        method="kl_cov", model=ModelConfig(dtype="float64"),
        task_options=TaskConfig(vocab=4, seq_len=4, eval_batches=1, eval_batch_size=4),
        diagnostics=DiagnosticsConfig(grad_diagnostics=True),
        run=RunConfig(num_steps=2, batch_size=8, group_size=4, eval_every=1, name="diag",
                      progress=False, device="cpu", runs_dir=str(tmp_path))))
    norms = [row["diag/grad_norm"] for row in result.metrics if "diag/grad_norm" in row]
    assert norms and all(math.isfinite(n) and n > 0 for n in norms)


def test_clip_cov_draw_follows_its_seed() -> None:
    """Among many candidates, the same seed draws the same token and other seeds others."""
    adv = torch.tensor([[3.0] * 20 + [-3.0] * 20], dtype=D)
    logp = torch.tensor([[-0.1] * 20 + [-2.0] * 20], dtype=D)
    cfg = dataclasses.replace(METHODS["clip_cov"].objective, clip_cov_ratio=0.01)

    def draw(seed: int) -> torch.Tensor:
        x = dataclasses.replace(_stat_inputs(adv, logp),
                                generator=torch.Generator().manual_seed(seed))
        return clip_cov_select(x, cfg)[0]

    assert torch.equal(draw(3), draw(3)) and draw(3).sum().item() == 1
    assert len({int(draw(s).argmax()) for s in range(8)}) > 1


def test_dapo_forking_with_rho_one_is_dapo_through_the_loop(tmp_path: Path) -> None:
    """ρ_H = 1 keeps every token: the same losses and final weights as `dapo`."""
    m_dapo, p_dapo = _train(tmp_path, "dapo", "dapo", 2)
    m_fork, p_fork = _train(tmp_path, "dapo_forking", "fork", 2, entropy_top_frac=1.0)
    assert [r["loss/total"] for r in m_fork] == [r["loss/total"] for r in m_dapo]
    assert all(r["gate/kept_frac"] == 1.0 for r in m_fork)
    for k, v in p_dapo.items():
        assert torch.equal(p_fork[k], v), k


def test_entropy_threshold_quantile_equals_torch_and_takes_any_size() -> None:
    """`linear_quantile` (the entropy_top gate's τ) is torch.quantile bit for bit on float32
    and float64, and also takes what torch.quantile refuses: more than 2^24 entropies (a
    minibatch of ~16.7M valid tokens) and bf16."""
    from rlscope.methods.batch_stats import linear_quantile

    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        for n in (1, 2, 10, 1001):
            h_N = torch.rand(n, generator=g, dtype=dtype)
            for q in (0.0, 0.37, 0.8, 1.0):
                assert torch.equal(linear_quantile(h_N, q), torch.quantile(h_N, q))
    big_N = torch.arange(2**24 + 1, dtype=torch.float32)
    with pytest.raises(RuntimeError):
        torch.quantile(big_N, 0.5)
    assert linear_quantile(big_N, 0.5).item() == 2**23
    assert linear_quantile(torch.tensor([0.0, 1.0], dtype=torch.bfloat16), 0.25).item() == 0.25
