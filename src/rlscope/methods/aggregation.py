"""Token aggregation: per-token losses to one scalar (METHODS.md, "Token aggregation").

``aggregate`` is written for gradient accumulation: the denominators are the *global* counts of
the whole optimizer batch (``n_tokens``, ``n_seqs``), so summing the results over micro-batches
gives exactly the loss of the full batch.
"""

from __future__ import annotations

import torch

TOKEN_MEAN = "token_mean"
"""Σ loss / Σ mask over the batch: also the value loss's aggregation, whatever the method's."""
AGGREGATIONS = (TOKEN_MEAN, "seq_mean_token_mean", "seq_mean_token_sum",
                "seq_mean_token_sum_norm", "sum")


def _at_least_one(n: torch.Tensor | float) -> torch.Tensor | float:
    """Clamp a count to >= 1 without a host sync when it is a tensor."""
    return n.clamp_min(1.0) if isinstance(n, torch.Tensor) else max(n, 1.0)


def aggregate(loss_BT: torch.Tensor, mask_BT: torch.Tensor, agg: str,
              n_tokens: torch.Tensor | float, n_seqs: torch.Tensor | float,
              max_len: int) -> torch.Tensor:
    """This micro-batch's share of the aggregated loss.

    - ``token_mean``: Σ m·ℓ / N_tokens (DAPO's token-level loss).
    - ``seq_mean_token_mean``: Σ_i (Σ_t m·ℓ / Σ_t m) / N_seqs (original GRPO).
    - ``seq_mean_token_sum``: Σ m·ℓ / N_seqs.
    - ``seq_mean_token_sum_norm``: Σ m·ℓ / (N_seqs · L), L the max completion length (Dr. GRPO).
    - ``sum``: Σ m·ℓ (Tinker semantics).
    """
    masked_BT = loss_BT * mask_BT
    if agg == "token_mean":
        return masked_BT.sum() / _at_least_one(n_tokens)
    if agg == "seq_mean_token_mean":
        per_seq_B = masked_BT.sum(-1) / mask_BT.sum(-1).clamp_min(1.0)
        return per_seq_B.sum() / _at_least_one(n_seqs)
    if agg == "seq_mean_token_sum":
        return masked_BT.sum() / _at_least_one(n_seqs)
    if agg == "seq_mean_token_sum_norm":
        return masked_BT.sum() / _at_least_one(n_seqs * max_len)
    if agg == "sum":
        return masked_BT.sum()
    raise ValueError(f"unknown aggregation {agg!r}; valid: {', '.join(AGGREGATIONS)}")
