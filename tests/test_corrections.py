"""Sampler-vs-learner off-policy corrections (METHODS.md, "Off-policy corrections").

The sampler's log-probs are written as ℓ_sampler = ℓ_old − log ρ for the ratios ρ we want, so
every expected weight is written from ρ.
"""

from __future__ import annotations

import math

import pytest
import torch
from fp64 import F64, TOL
from fp64 import t as _t

from rlscope.methods.corrections import CORRECTIONS, CorrectionConfig


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
    assert (cfg.name, cfg.cap, cfg.band_low, cfg.band_high, cfg.geometric) == \
        ("none", 2.0, 0.5, 5.0, False)


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
