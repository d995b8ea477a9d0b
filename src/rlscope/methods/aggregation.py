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
                "seq_mean_token_sum_norm", "sum", "prompt_mean")


def _at_least_one(n: torch.Tensor | float) -> torch.Tensor | float:
    """Clamp a count to >= 1 without a host sync when it is a tensor."""
    return n.clamp_min(1.0) if isinstance(n, torch.Tensor) else max(n, 1.0)


def aggregate(loss_BT: torch.Tensor, mask_BT: torch.Tensor, agg: str,
              n_tokens: torch.Tensor | float, n_seqs: torch.Tensor | float,
              max_len: int, group_tokens_B: torch.Tensor | None = None,
              n_groups: torch.Tensor | float = 1.0) -> torch.Tensor:
    """This micro-batch's share of the aggregated loss.

    - ``token_mean``: Σ m·ℓ / N_tokens (DAPO's token-level loss).
    - ``seq_mean_token_mean``: Σ_i (Σ_t m·ℓ / Σ_t m) / N_seqs (original GRPO).
    - ``seq_mean_token_sum``: Σ m·ℓ / N_seqs.
    - ``seq_mean_token_sum_norm``: Σ m·ℓ / (N_seqs · L), L the max completion length (Dr. GRPO).
    - ``sum``: Σ m·ℓ (Tinker semantics).
    - ``prompt_mean``: mean over the groups with a valid token of (Σ_{i∈g,t} m·ℓ /
      Σ_{i∈g,t} m) (ScaleRL): each row's Σ_t m·ℓ / (``group_tokens_B`` · ``n_groups``), with
      ``group_tokens_B`` the valid tokens of the row's whole group and ``n_groups`` the
      optimizer batch's groups with a valid token (`group_token_counts`).
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
    if agg == "prompt_mean":
        if group_tokens_B is None:
            raise ValueError("aggregation 'prompt_mean' needs each row's group token count")
        per_row_B = masked_BT.sum(-1) / group_tokens_B.clamp_min(1.0)
        return per_row_B.sum() / _at_least_one(n_groups)
    raise ValueError(f"unknown aggregation {agg!r}; valid: {', '.join(AGGREGATIONS)}")


def segment_weighted(loss_BT: torch.Tensor, mask_BT: torch.Tensor, weight_B: torch.Tensor,
                     n_trees: int) -> torch.Tensor:
    """This micro-batch's share of the RLM step loss Σ_s w_s · L_s / N_trees, with L_s the
    token mean of segment s's losses (COMPANIONS.md §4, "Credit propagation", step 5).

    One row per segment (a generated turn of a root or a child of some tree); ``weight_B`` its
    credit weight w_s (root turn 1/n_root, child turn 1/(k·n_j)); ``n_trees`` the optimizer
    batch's trees, a global count, so summing the shares over micro-batches gives the loss of
    the whole batch. Not one of `AGGREGATIONS`: it reads per-row weights the rollout loop has
    no notion of; only the ``tree`` step calls it.
    """
    if n_trees < 1:
        raise ValueError(f"n_trees={n_trees} must be >= 1")
    per_segment_B = (loss_BT * mask_BT).sum(-1) / mask_BT.sum(-1).clamp_min(1.0)
    return (weight_B * per_segment_B).sum() / n_trees


def group_token_counts(mask_BT: torch.Tensor, group_size: int) -> torch.Tensor:
    """Valid tokens of each row's group (contiguous rows), ``[B]``; the row's own count when
    the rows do not split into groups of ``group_size``."""
    tokens_B = mask_BT.sum(-1)
    if group_size < 2 or tokens_B.shape[0] % group_size:
        return tokens_B
    return tokens_B.view(-1, group_size).sum(-1).repeat_interleave(group_size)


def count_groups(mask_BT: torch.Tensor, group_tokens_B: torch.Tensor) -> torch.Tensor:
    """Groups with a valid token among these rows (whole groups): Σ_i |y_i| / |y_g(i)| (0-d)."""
    return (mask_BT.sum(-1) / group_tokens_B.clamp_min(1.0)).sum()
