"""`mixed_groups` selection (METHODS.md, "Selection")."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlscope.batch import RolloutBatch
from rlscope.config import RunConfig, TrainConfig
from rlscope.methods import METHODS
from rlscope.methods.selection import SELECTIONS, fill_mixed_groups, mixed_groups
from rlscope.tasks import TaskConfig
from rlscope.train import train


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
    """Every preset that compares the rollouts of a group; the candidate presets (tpo_token,
    grpo_token) compare next-token candidates instead, so a group of equal rollout rewards
    still carries signal and they keep every rollout (docs/architecture.md)."""
    grouped = {name for name, spec in METHODS.items()
               if spec.grouped and not spec.needs_candidates}
    assert {"grpo", "dr_grpo", "dapo", "tpo", "tpo_no_anchor", "group_pg"} <= grouped
    assert all(METHODS[n].selection == "none" for n in ("tpo_token", "grpo_token"))
    for name in grouped:
        assert METHODS[name].selection == "mixed_groups", name


def test_fill_batch_resamples_until_mixed_groups_fill_it(tmp_path: Path) -> None:
    """With --fill_batch every trained row belongs to a mixed group, the batch is full, and the
    extra rounds are logged; without it the batch shrinks to the mixed groups."""
    def run(fill: bool) -> list[dict[str, float]]:
        return train(TrainConfig(
            method="grpo", task_options=TaskConfig(seq_len=2, vocab=2, binary_reward=True,
                                                   eval_batches=1, eval_batch_size=8),
            run=RunConfig(num_steps=3, batch_size=32, group_size=4, fill_batch=fill,
                          max_fill_rounds=20, eval_every=0, progress=False, device="cpu",
                          runs_dir=str(tmp_path), name=f"fill{fill}"))).metrics

    filled, plain = run(True), run(False)
    assert all(row["group/mixed_rate"] == 1.0 and row["group/retained_rate"] == 1.0
               for row in filled)
    assert any(row["group/fill_rounds"] > 1 for row in filled)
    assert any(row["group/retained_rate"] < 1.0 for row in plain)


def test_fill_batch_that_cannot_fill_says_what_to_change() -> None:
    g = torch.Generator().manual_seed(0)

    def one_mixed_group() -> RolloutBatch:
        rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
        return _rollout(rewards, g)

    with pytest.raises(RuntimeError, match="max_fill_rounds"):
        # one mixed group of 4 rows per round: 3 rounds give 12 of the 16 rows
        fill_mixed_groups(one_mixed_group(), one_mixed_group, rows=16, group_size=4, max_rounds=3)


def _rollout(rewards_B: torch.Tensor, g: torch.Generator) -> RolloutBatch:
    B = rewards_B.shape[0]
    return RolloutBatch(
        prompt_tokens_BP=torch.randint(0, 2, (B, 3), generator=g), prompt_mask_BP=None,
        completion_tokens_BT=torch.randint(0, 2, (B, 2), generator=g),
        completion_mask_BT=torch.ones(B, 2), logp_sampler_BT=torch.zeros(B, 2),
        logp_raw_BT=torch.zeros(B, 2), finished_by_stop_B=torch.zeros(B, dtype=torch.bool),
        group_id_B=torch.arange(B) // 4, rewards_B=rewards_B)


def test_fill_batch_keeps_exactly_the_mixed_groups_in_order() -> None:
    g = torch.Generator().manual_seed(0)
    first = _rollout(torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]), g)
    more = _rollout(torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0]), g)
    batch, rounds = fill_mixed_groups(first, lambda: more, rows=8, group_size=4, max_rounds=2)
    assert rounds == 2
    assert torch.equal(batch.rewards_B, torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0]))
    assert torch.equal(batch.completion_tokens_BT[:4], first.completion_tokens_BT[:4])
    assert torch.equal(batch.completion_tokens_BT[4:], more.completion_tokens_BT[4:])
    assert batch.group_id_B.unique().numel() == 2
