"""`mixed_groups` selection (METHODS.md, "Selection")."""

from __future__ import annotations

import torch

from rlscope.methods import METHODS
from rlscope.methods.selection import SELECTIONS, mixed_groups


def _floats(stats: dict[str, torch.Tensor]) -> dict[str, float]:
    return {k: float(v) for k, v in stats.items()}


def test_keeps_only_mixed_groups() -> None:
    # Groups of 2: (1, 0) mixed, (1, 1) uniform, (0, 0) uniform, (0.5, 0.25) mixed.
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.5, 0.25])
    keep, stats = mixed_groups(rewards, 2)
    assert keep.tolist() == [True, True, False, False, False, False, True, True]
    assert _floats(stats) == {"group/mixed_rate": 2 / 4, "group/retained_rate": 4 / 8,
                              "group/fallback": 0.0}


def test_all_uniform_falls_back_to_keeping_everything() -> None:
    keep, stats = mixed_groups(torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0]), 3)
    assert keep.tolist() == [True] * 6
    assert _floats(stats) == {"group/mixed_rate": 0.0, "group/retained_rate": 1.0,
                              "group/fallback": 1.0}


def test_all_mixed_keeps_everything_without_fallback() -> None:
    keep, stats = mixed_groups(torch.tensor([1.0, 0.0, 0.0, 1.0]), 2)
    assert keep.tolist() == [True] * 4
    assert _floats(stats) == {"group/mixed_rate": 1.0, "group/retained_rate": 1.0,
                              "group/fallback": 0.0}


def test_std_threshold_is_1e_6() -> None:
    # Population std of (0, 1e-6) is 5e-7 ≤ 1e-6 → uniform; of (0, 4e-6) is 2e-6 → mixed.
    rewards = torch.tensor([0.0, 1e-6, 0.0, 4e-6], dtype=torch.float64)
    keep, stats = mixed_groups(rewards, 2)
    assert keep.tolist() == [False, False, True, True]
    assert float(stats["group/mixed_rate"]) == 0.5


def test_grouped_presets_select_mixed_groups_by_default() -> None:
    assert SELECTIONS == ("none", "mixed_groups")
    grouped = {name for name, spec in METHODS.items() if spec.grouped}
    assert {"grpo", "dr_grpo", "dapo"} <= grouped
    for name in grouped:
        assert METHODS[name].selection == "mixed_groups", name
