"""Sampler-vs-learner off-policy corrections (METHODS.md, "Off-policy corrections").

The sampler's log-probs are written as ℓ_sampler = ℓ_old − log ρ for the ratios ρ we want, so
every expected weight is written from ρ.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from fp64 import F64, TOL
from fp64 import t as _t

from rlscope.config import ConfigError, RunConfig, TrainConfig, correction_warnings, validate
from rlscope.methods import METHODS, MethodConfig
from rlscope.methods.catalog import describe, summary
from rlscope.methods.corrections import (
    CORRECTION_METRICS,
    CORRECTIONS,
    CorrectionConfig,
    correction_metrics,
    weight_ess,
)
from rlscope.policy import ModelConfig
from rlscope.replay import ReplayConfig
from rlscope.sampling import SamplingConfig
from rlscope.tasks import TaskConfig


def _pair(rho: list[list[float]], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(ℓ_old, ℓ_sampler) with exp(ℓ_old − ℓ_sampler) = ρ."""
    g = torch.Generator().manual_seed(seed)
    logp_old = -torch.rand(len(rho), len(rho[0]), generator=g, dtype=F64) - 0.1
    return logp_old, logp_old - _t(rho).log()


def test_registry_lists_every_correction() -> None:
    assert set(CORRECTIONS) == {"none", "token_truncate", "token_mask", "sequence_truncate",
                                "sequence_mask"}


def test_defaults() -> None:
    cfg = CorrectionConfig()
    assert (cfg.name, cfg.cap, cfg.cap_low, cfg.band_low, cfg.band_high, cfg.geometric,
            cfg.keep_ratio) == ("none", 2.0, 0.0, 0.5, 5.0, False, False)


def test_none_is_one() -> None:
    old, sampler = _pair([[0.5, 3.0]])
    w, stats = CORRECTIONS["none"](old, sampler, torch.ones_like(old), CorrectionConfig())
    assert torch.equal(w, torch.ones_like(old))
    assert stats == {}


def test_token_truncate_values() -> None:
    # min(ρ, 2): [0.5, 1, 3, 2] → [0.5, 1, 2, 2]; only ρ = 3 is capped (ρ = C is not).
    old, sampler = _pair([[0.5, 1.0, 3.0, 2.0]])
    w, stats = CORRECTIONS["token_truncate"](old, sampler, torch.ones_like(old),
                                             CorrectionConfig("token_truncate"))
    torch.testing.assert_close(w, _t([[0.5, 1.0, 2.0, 2.0]]), **TOL)
    torch.testing.assert_close(stats["is_ratio"], _t([[0.5, 1.0, 3.0, 2.0]]), **TOL)
    assert torch.equal(stats["is_capped"], _t([[0.0, 0.0, 1.0, 0.0]]))


def test_token_mask_values() -> None:
    # Band [0.5, 5] inclusive: ρ = [0.4, 0.5, 1, 5, 6] → keep [0, 1, 1, 1, 0]. The weight is the
    # indicator, not the ratio. Computed from exp(log ρ), so the boundaries are moved by 1e-9.
    old, sampler = _pair([[0.4, 0.5 + 1e-9, 1.0, 5.0 - 1e-9, 6.0]])
    w, stats = CORRECTIONS["token_mask"](old, sampler, torch.ones_like(old),
                                         CorrectionConfig("token_mask"))
    assert torch.equal(w, _t([[0.0, 1.0, 1.0, 1.0, 0.0]]))
    assert torch.equal(stats["is_masked"], _t([[1.0, 0.0, 0.0, 0.0, 1.0]]))


# Row 0: ρ = [2, 1.5] → product 3, geometric √3.
# Row 1: ρ = [0.5, 1.2, (10, masked)] → product 0.6, geometric √0.6; the masked token is ignored.
# Row 2: ρ = [4, 4] → product 16, geometric 4.
# Row 3: ρ = [0.2601, 1] → product 0.2601, geometric 0.51 (kept clear of the 0.5 boundary,
#        which exp∘log rounding could put on either side).
SEQ_RHO = [[2.0, 1.5, 1.0], [0.5, 1.2, 10.0], [4.0, 4.0, 1.0], [0.2601, 1.0, 1.0]]
SEQ_MASK = _t([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])


def _rows(values: list[float]) -> torch.Tensor:
    return _t([[v] * 3 for v in values])


def test_sequence_truncate_values() -> None:
    old, sampler = _pair(SEQ_RHO)
    cfg = CorrectionConfig("sequence_truncate")
    w, stats = CORRECTIONS["sequence_truncate"](old, sampler, SEQ_MASK, cfg)
    # min(product, 2): [3, 0.6, 16, 0.2601] → [2, 0.6, 2, 0.2601], broadcast to every token.
    torch.testing.assert_close(w, _rows([2.0, 0.6, 2.0, 0.2601]), **TOL)
    torch.testing.assert_close(stats["is_ratio"], _rows([3.0, 0.6, 16.0, 0.2601]), **TOL)
    assert torch.equal(stats["is_capped"], _rows([1.0, 0.0, 1.0, 0.0]))
    w_geo, _ = CORRECTIONS["sequence_truncate"](old, sampler, SEQ_MASK,
                                                CorrectionConfig("sequence_truncate",
                                                                 geometric=True))
    # min(geometric, 2): [√3, √0.6, 4, 0.51] → [√3, √0.6, 2, 0.51].
    torch.testing.assert_close(w_geo, _rows([math.sqrt(3.0), math.sqrt(0.6), 2.0, 0.51]), **TOL)


def test_sequence_mask_values() -> None:
    old, sampler = _pair(SEQ_RHO)
    w, _ = CORRECTIONS["sequence_mask"](old, sampler, SEQ_MASK, CorrectionConfig("sequence_mask"))
    # product [3, 0.6, 16, 0.2601] within [0.5, 5]? → [1, 1, 0, 0].
    assert torch.equal(w, _rows([1.0, 1.0, 0.0, 0.0]))
    w_geo, stats = CORRECTIONS["sequence_mask"](old, sampler, SEQ_MASK,
                                                CorrectionConfig("sequence_mask", geometric=True))
    # geometric [√3, √0.6, 4, 0.51] → all inside the band.
    assert torch.equal(w_geo, _rows([1.0, 1.0, 1.0, 1.0]))
    assert torch.equal(stats["is_masked"], _rows([0.0, 0.0, 0.0, 0.0]))


@pytest.mark.parametrize("name", sorted(CORRECTIONS))
@pytest.mark.parametrize("geometric", [False, True])
def test_same_policy_gives_unit_weight(name: str, geometric: bool) -> None:
    # ℓ_old = ℓ_sampler: every ratio is exactly 1, so every correction is the identity.
    old = -torch.rand(3, 5, generator=torch.Generator().manual_seed(1), dtype=F64)
    mask = _t([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    w, _ = CORRECTIONS[name](old, old.clone(), mask, CorrectionConfig(name, geometric=geometric))
    assert torch.equal(w, torch.ones_like(old))


# --------------------------------------------------- METHODS_2026.md §2–§3: keep_ratio, cap_low

RHO_EXAMPLE = [[0.4, 1.0, 2.5, 6.0]]


def test_worked_example_of_the_presets() -> None:
    """§3: ρ_c = (0.4, 1, 2.5, 6) → TIS (0.4, 1, 2, 2), IcePop (0, 1, 2.5, 0), the existing
    token_mask (0, 1, 1, 0); each preset's own correction config."""
    old, sampler = _pair(RHO_EXAMPLE)
    ones = torch.ones_like(old)
    tis, icepop = METHODS["grpo_tis"].correction, METHODS["icepop"].correction
    w, stats = CORRECTIONS[tis.name](old, sampler, ones, tis)
    torch.testing.assert_close(w, _t([[0.4, 1.0, 2.0, 2.0]]), **TOL)
    assert torch.equal(stats["is_capped"], _t([[0.0, 0.0, 1.0, 1.0]]))
    w, stats = CORRECTIONS[icepop.name](old, sampler, ones, icepop)
    torch.testing.assert_close(w, _t([[0.0, 1.0, 2.5, 0.0]]), **TOL)
    assert torch.equal(stats["is_masked"], _t([[1.0, 0.0, 0.0, 1.0]]))
    assert torch.equal(stats["is_low"], _t([[1.0, 0.0, 0.0, 0.0]]))
    assert torch.equal(stats["is_high"], _t([[0.0, 0.0, 0.0, 1.0]]))
    w, _ = CORRECTIONS["token_mask"](old, sampler, ones, CorrectionConfig("token_mask"))
    assert torch.equal(w, _t([[0.0, 1.0, 1.0, 0.0]]))


def test_grpo_mis_example_weighs_by_the_sequence_ratio() -> None:
    """§3: rows with token ratios (1.5, 1.5) and (2, 2): products 2.25 ≤ 3 (kept, weight 2.25)
    and 4 > 3 (dropped, 0) on every token of the row; the band's lower end is 0."""
    old, sampler = _pair([[1.5, 1.5], [2.0, 2.0]])
    cfg = METHODS["grpo_mis"].correction
    assert (cfg.band_low, cfg.band_high, cfg.keep_ratio) == (0.0, 3.0, True)
    w, stats = CORRECTIONS[cfg.name](old, sampler, torch.ones_like(old), cfg)
    torch.testing.assert_close(w, _t([[2.25, 2.25], [0.0, 0.0]]), **TOL)
    assert torch.equal(stats["is_masked"], _t([[0.0, 0.0], [1.0, 1.0]]))


def test_keep_ratio_replaces_an_infinite_dropped_ratio_by_zero() -> None:
    # Σ log ρ = 800 overflows exp: the row is dropped with weight 0, not inf·0 = nan.
    old = torch.zeros(1, 2, dtype=F64)
    w, _ = CORRECTIONS["sequence_mask"](old, old - 400.0, torch.ones_like(old),
                                        CorrectionConfig("sequence_mask", keep_ratio=True))
    assert torch.equal(w, torch.zeros_like(old))


def test_cap_low_bounds_truncation_from_below() -> None:
    """clamp(ρ, 0.5, 2): ρ = (0.1, 0.4, 1, 3) → (0.5, 0.5, 1, 2); both sides count as capped.
    Sequence variant: products (0.04, 3) → (0.5, 2)."""
    cfg = CorrectionConfig("token_truncate", cap_low=0.5)
    old, sampler = _pair([[0.1, 0.4, 1.0, 3.0]])
    w, stats = CORRECTIONS["token_truncate"](old, sampler, torch.ones_like(old), cfg)
    torch.testing.assert_close(w, _t([[0.5, 0.5, 1.0, 2.0]]), **TOL)
    assert torch.equal(stats["is_low"], _t([[1.0, 1.0, 0.0, 0.0]]))
    assert torch.equal(stats["is_high"], _t([[0.0, 0.0, 0.0, 1.0]]))
    assert torch.equal(stats["is_capped"], _t([[1.0, 1.0, 0.0, 1.0]]))
    old, sampler = _pair([[0.1, 0.4], [3.0, 1.0]])
    w, _ = CORRECTIONS["sequence_truncate"](old, sampler, torch.ones_like(old),
                                            CorrectionConfig("sequence_truncate", cap_low=0.5))
    torch.testing.assert_close(w, _t([[0.5, 0.5], [2.0, 2.0]]), **TOL)


IDENTITY_CONFIGS = [METHODS[name].correction for name in ("grpo_tis", "grpo_mis", "icepop")] + [
    CorrectionConfig("token_truncate", cap_low=0.5),
    CorrectionConfig("sequence_truncate", cap_low=0.9, geometric=True),
    CorrectionConfig("token_mask", keep_ratio=True, band_low=0.0, band_high=1.0),
    CorrectionConfig("sequence_mask", keep_ratio=True, geometric=True)]


@pytest.mark.parametrize("cfg", IDENTITY_CONFIGS, ids=lambda c: c.name)
def test_new_settings_are_the_identity_on_policy(cfg: CorrectionConfig) -> None:
    """ℓ_s = ℓ_o: w ≡ 1 bit-for-bit, and the metrics are exactly those of no mismatch."""
    old = -torch.rand(3, 5, generator=torch.Generator().manual_seed(2), dtype=F64)
    mask = _t([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    w, stats = CORRECTIONS[cfg.name](old, old.clone(), mask, cfg)
    assert torch.equal(w, torch.ones_like(old))
    m = correction_metrics(old, old.clone(), mask, w, stats)
    assert set(m) == set(CORRECTION_METRICS)
    ones = ("is_mean", "is_max", "is_min", "correction_weight_mean", "correction_ess")
    assert {k: float(v) for k, v in m.items()} == {
        k: (1.0 if k.removeprefix("sampler/") in ones else 0.0) for k in CORRECTION_METRICS}


def test_weight_ess_by_hand() -> None:
    """ESS = 1/mean(ŵ²), ŵ = w/mean(w): (1, 1, 2, 0) → 1/((1 + 1 + 4 + 0)/4) = 0.666667; a
    masked token is ignored; equal weights give 1, all-zero weights 0."""
    assert float(weight_ess(_t([[1.0, 1.0, 2.0, 0.0]]), _t([[1, 1, 1, 1]]))) == \
        pytest.approx(2 / 3, abs=1e-12)
    assert float(weight_ess(_t([[1.0, 1.0, 2.0, 0.0, 9.0]]), _t([[1, 1, 1, 1, 0]]))) == \
        pytest.approx(0.666667, abs=1e-6)
    assert float(weight_ess(_t([[3.0, 3.0]]), _t([[1, 1]]))) == 1.0
    assert float(weight_ess(_t([[0.0, 0.0]]), _t([[1, 1]]))) == 0.0


def test_correction_metrics_by_hand() -> None:
    """IcePop on row 0 ρ = (0.4, 1, 2.5, 6) and row 1 ρ = (1, 1) plus two padding tokens of
    ρ = 50 that must not count: 6 valid tokens, weights (0, 1, 2.5, 0, 1, 1)."""
    old, sampler = _pair([[0.4, 1.0, 2.5, 6.0], [1.0, 1.0, 50.0, 50.0]])
    mask = _t([[1, 1, 1, 1], [1, 1, 0, 0]])
    cfg = METHODS["icepop"].correction
    w, stats = CORRECTIONS[cfg.name](old, sampler, mask, cfg)
    m = {k: float(v) for k, v in correction_metrics(old, sampler, mask, w, stats).items()}
    rho = [0.4, 1.0, 2.5, 6.0, 1.0, 1.0]
    weights = [0.0, 1.0, 2.5, 0.0, 1.0, 1.0]
    expected = {
        "sampler/is_mean": 11.9 / 6,
        "sampler/is_max": 6.0,
        "sampler/is_min": 0.4,
        "sampler/chi2_token": (0.16 + 1 + 6.25 + 36 + 1 + 1) / 6 - 1,   # 6.568333
        "sampler/k3": sum(r - 1 - math.log(r) for r in rho) / 6,        # 0.684707
        "sampler/seq_log_ratio": (math.log(0.4 * 2.5 * 6) + 0.0) / 2,   # log 6 / 2
        "sampler/frac_high": 1 / 6,
        "sampler/frac_low": 1 / 6,
        "sampler/masked_frac": 2 / 6,
        "sampler/seq_masked_frac": 1 / 2,
        "sampler/correction_weight_mean": 5.5 / 6,
        "sampler/correction_ess": 5.5 ** 2 / (6 * sum(x * x for x in weights)),  # 30.25/55.5
        "sampler/correction_active_frac": 2 / 6,
    }
    assert set(m) == set(expected) == set(CORRECTION_METRICS)
    for key, value in expected.items():
        assert m[key] == pytest.approx(value, abs=1e-12), key
    assert m["sampler/chi2_token"] == pytest.approx(6.568333, abs=1e-6)
    assert m["sampler/k3"] == pytest.approx(0.684707, abs=1e-6)
    assert m["sampler/correction_ess"] == pytest.approx(0.545045, abs=1e-6)


# ------------------------------------------------------------------- validation and warning


def _cfg(method: str, components: MethodConfig | None = None, **options: object) -> TrainConfig:
    return TrainConfig(method=method, components=components or MethodConfig(),
                       task_options=TaskConfig(seq_len=4, eval_batches=1, eval_batch_size=4),
                       run=RunConfig(batch_size=8, group_size=4), **options)  # type: ignore


@pytest.mark.parametrize(("components", "message"), [
    (MethodConfig(is_band_low=3.0, is_band_high=3.0), "method.is_band_low=3.0 and "
     "method.is_band_high=3.0 need 0 <= is_band_low < is_band_high"),
    (MethodConfig(is_band_low=-0.1), "method.is_band_low=-0.1"),
    (MethodConfig(is_correction="token_truncate", is_correction_cap=2.0,
                  is_correction_cap_low=2.0),
     r"method.is_correction_cap_low=2.0 must lie in \[0, is_correction_cap=2.0\)"),
    (MethodConfig(is_correction="token_truncate", is_correction_cap=0.0),
     "method.is_correction_cap=0.0 must be > 0"),
    (MethodConfig(is_correction="token_truncate", is_keep_ratio=True),
     "method.is_keep_ratio only acts with a mask correction"),
    (MethodConfig(is_correction_cap_low=0.5), "method.is_correction_cap_low only acts with a "
     "truncate correction"),
])
def test_bad_correction_settings_are_rejected_naming_the_flag(components: MethodConfig,
                                                              message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        validate(_cfg("icepop", components))


def test_presets_validate_and_warn_when_the_learner_samples() -> None:
    """§4: the presets need sampler log-probs; with the learner sampling (the sandbox default)
    they reduce to grpo: a warning, not an error. Staleness or an unreplayed top-k set is a real
    mismatch: no warning. grpo has no correction: no warning."""
    for name in ("grpo_tis", "grpo_mis", "icepop"):
        spec, _, _ = validate(_cfg(name))
        assert spec == METHODS[name]
        (warning,) = correction_warnings(_cfg(name), spec)
        assert f"method {name!r}" in warning and "every weight is 1" in warning
        stale = _cfg(name, replay=ReplayConfig(replay_capacity=4))
        assert correction_warnings(stale, spec) == []
        unreplayed = _cfg(name, sampling=SamplingConfig(top_k=2, replay_sampling_mask=False))
        assert correction_warnings(unreplayed, spec) == []
        replayed = _cfg(name, sampling=SamplingConfig(top_k=2))
        assert len(correction_warnings(replayed, spec)) == 1
    assert correction_warnings(_cfg("grpo"), METHODS["grpo"]) == []


def test_no_correction_warning_when_the_static_sampler_decodes() -> None:
    """The static sampler decodes from its own weight copy with its own kernels (bf16 under
    --autocast on CUDA): ℓ_s differs from ℓ_o and the correction acts, so no warning for a
    Hugging Face model with --backend static, or auto off the CPU; the eager backend on the
    same model, or auto on the CPU, samples with the learner's weights and still warns."""
    spec = METHODS["icepop"]
    hf = ModelConfig(arch="qwen2")

    def warns(backend: str, device: str) -> bool:
        cfg = _cfg("icepop", model=hf, sampling=SamplingConfig(backend=backend))
        cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, device=device))
        return bool(correction_warnings(cfg, spec))

    assert not warns("static", "cpu") and not warns("auto", "cuda")
    assert warns("eager", "cuda") and warns("auto", "cpu")


@pytest.mark.parametrize("name", sorted(CORRECTIONS))
def test_weight_is_detached_and_shape_checked(name: str) -> None:
    old = torch.zeros(2, 3, dtype=F64, requires_grad=True)
    w, stats = CORRECTIONS[name](old, torch.full((2, 3), -0.5, dtype=F64), torch.ones(2, 3),
                                 CorrectionConfig(name))
    assert not w.requires_grad
    assert all(not s.requires_grad and s.shape == (2, 3) for s in stats.values())
    with pytest.raises(ValueError, match="shape"):
        CORRECTIONS[name](old, torch.zeros(2, 4, dtype=F64), torch.ones(2, 3),
                          CorrectionConfig(name))


def test_catalog_shows_the_correction_and_its_need() -> None:
    """`rlscope methods`: the one-line summary ends with the correction, the detail names its
    settings with their flags, and the presets with a correction need sampler log-probs."""
    assert summary(METHODS["icepop"]).endswith(" · token_mask band [0.5, 5] × ρ")
    assert summary(METHODS["grpo_tis"]).endswith(" · token_truncate C 2")
    assert summary(METHODS["grpo_mis"]).endswith(" · sequence_mask band [0, 3] × ρ")
    assert "token_truncate" not in summary(METHODS["grpo"])
    detail = describe("grpo_mis")
    assert "run needs      groups, sampler log-probs" in detail
    assert ("sequence_mask (--is_correction); band_low 0.0 (--is_band_low), band_high 3.0 "
            "(--is_band_high), geometric False (--is_geometric), keep_ratio True "
            "(--is_keep_ratio)") in detail
    assert "cap_low 0.0 (--is_correction_cap_low)" in describe("grpo_tis")
    assert "sampler log-probs" not in describe("grpo")
