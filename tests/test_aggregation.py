"""Token aggregation (METHODS.md, "Token aggregation"): the five reductions by hand.

Per-token losses 1..12 on 3 sequences × 4 tokens with lengths 4, 2, 3; masked positions hold
100 so that any leak shows. Valid sums per row: 1+2+3+4 = 10, 5+6 = 11, 9+10+11 = 30;
total 51 over 9 tokens.
"""

from __future__ import annotations

import pytest
import torch

from rlscope.methods.aggregation import AGGREGATIONS, aggregate

F64 = torch.float64
LOSS = torch.tensor([[1.0, 2.0, 3.0, 4.0],
                     [5.0, 6.0, 100.0, 100.0],
                     [9.0, 10.0, 11.0, 100.0]], dtype=F64)
MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0],
                     [1.0, 1.0, 0.0, 0.0],
                     [1.0, 1.0, 1.0, 0.0]], dtype=F64)
N_TOKENS, N_SEQS, MAX_LEN = 9.0, 3.0, 4

EXPECTED = {
    "token_mean": (10 + 11 + 30) / 9,                        # 5.666…
    "seq_mean_token_mean": (10 / 4 + 11 / 2 + 30 / 3) / 3,   # (2.5 + 5.5 + 10) / 3 = 6
    "seq_mean_token_sum": (10 + 11 + 30) / 3,                # 17
    "seq_mean_token_sum_norm": (10 + 11 + 30) / (3 * 4),     # 4.25
    "sum": 10 + 11 + 30,                                     # 51
}


def test_registry_lists_the_five() -> None:
    # prompt_mean (per-group denominators) is tested in tests/test_methods_2026_adv.py
    assert set(AGGREGATIONS) == set(EXPECTED) | {"prompt_mean"}


@pytest.mark.parametrize("agg", list(EXPECTED))
def test_full_batch_values(agg: str) -> None:
    out = aggregate(LOSS, MASK, agg, N_TOKENS, N_SEQS, MAX_LEN)
    assert abs(float(out) - EXPECTED[agg]) < 1e-12


def test_seq_mean_token_sum_norm_uses_configured_max_len() -> None:
    # L is the configured max completion length, not the longest row: 51 / (3 · 8) = 2.125.
    assert float(aggregate(LOSS, MASK, "seq_mean_token_sum_norm", N_TOKENS, N_SEQS, 8)) == 2.125


@pytest.mark.parametrize("agg", list(EXPECTED))
def test_micro_batches_with_global_denominators_sum_to_the_full_batch(agg: str) -> None:
    parts = [aggregate(LOSS[i:i + 1], MASK[i:i + 1], agg, N_TOKENS, N_SEQS, MAX_LEN)
             for i in range(3)]
    # e.g. token_mean: 10/9 + 11/9 + 30/9 = 51/9.
    assert abs(float(sum(parts)) - EXPECTED[agg]) < 1e-12


def test_local_denominators_would_change_token_mean() -> None:
    # The bug global denominators prevent: per-row token means 10/4 + 11/2 + 30/3 = 18 ≠ 51/9.
    local = sum(float(aggregate(LOSS[i:i + 1], MASK[i:i + 1], "token_mean",
                                float(MASK[i].sum()), 1.0, MAX_LEN)) for i in range(3))
    assert abs(local - 18.0) < 1e-12
    assert abs(local - EXPECTED["token_mean"]) > 1.0


def test_equal_lengths_make_token_and_sequence_means_agree() -> None:
    # With every row full (length L = 4), Σ/(N·L) = mean_i(Σ_t/L): token_mean =
    # seq_mean_token_mean = seq_mean_token_sum_norm, and seq_mean_token_sum = L × token_mean.
    full = torch.ones(3, 4, dtype=F64)
    loss = LOSS.clone()
    # Σ of all 12 entries: 1+2+3+4 + 5+6+100+100 + 9+10+11+100 = 351.
    out = {a: float(aggregate(loss, full, a, 12.0, 3.0, 4)) for a in EXPECTED}
    assert abs(out["token_mean"] - 351 / 12) < 1e-12
    assert abs(out["seq_mean_token_mean"] - 351 / 12) < 1e-12
    assert abs(out["seq_mean_token_sum_norm"] - 351 / 12) < 1e-12
    assert abs(out["seq_mean_token_sum"] - 4 * 351 / 12) < 1e-12


def test_empty_row_counts_as_a_sequence_with_zero_loss() -> None:
    mask = MASK.clone()
    mask[1] = 0.0
    # seq_mean_token_mean: (10/4 + 0 + 30/3) / 3 = 12.5 / 3.
    out = aggregate(LOSS, mask, "seq_mean_token_mean", 7.0, 3.0, MAX_LEN)
    assert abs(float(out) - 12.5 / 3) < 1e-12


def test_unknown_aggregation_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="valid: token_mean, seq_mean_token_mean"):
        aggregate(LOSS, MASK, "mean", N_TOKENS, N_SEQS, MAX_LEN)
