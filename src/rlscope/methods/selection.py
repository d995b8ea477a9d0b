"""Sample selection before the update (METHODS.md, "Selection").

`mixed_groups` (dynamic sampling, DAPO arXiv:2503.14476): keep only groups whose reward std is
above 1e-6. If no group survives, keep everything and report a fallback. `fill_mixed_groups`
resamples until the kept groups fill the batch (capped generation rounds).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlscope.batch import RolloutBatch, concat_rollouts

SELECTIONS = ("none", "mixed_groups")
MIXED_STD = 1e-6


def mixed_groups(rewards_B: torch.Tensor, group_size: int
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Rows to keep, ``keep_B`` (bool), and ``group/`` metrics as 0-d tensors.

    ``mixed_rate``: fraction of groups with reward std > 1e-6 (before filtering);
    ``retained_rate``: fraction of rows kept; ``fallback``: 1 when no group was mixed and every
    row was kept.
    """
    std_G = rewards_B.view(-1, group_size).std(-1, unbiased=False)
    mixed_G = std_G > MIXED_STD
    fallback = ~mixed_G.any()
    keep_G = mixed_G | fallback
    keep_B = keep_G.repeat_interleave(group_size)
    return keep_B, {
        "group/mixed_rate": mixed_G.float().mean(),
        "group/retained_rate": keep_B.float().mean(),
        "group/fallback": fallback.float(),
    }


def fill_mixed_groups(first: RolloutBatch, sample_more: Callable[[], RolloutBatch], rows: int,
                      group_size: int, max_rounds: int) -> tuple[RolloutBatch, int]:
    """DAPO's dynamic sampling: keep mixed groups and sample more until ``rows`` are filled.

    Returns ``(batch, rounds)``. ``batch`` holds exactly ``rows`` rows of mixed groups, in the
    order they were drawn; when the first round has no mixed group at all it is returned as is
    (the caller's fallback and out-of-regime rules apply). Raises RuntimeError, saying what to
    change, when ``max_rounds`` generation rounds cannot fill the batch.
    """
    def mixed_rows(batch: RolloutBatch) -> torch.Tensor:
        assert batch.rewards_B is not None
        std_G = batch.rewards_B.view(-1, group_size).std(-1, unbiased=False)
        return (std_G > MIXED_STD).repeat_interleave(group_size)

    keep_B = mixed_rows(first)
    if not bool(keep_B.any()):
        return first, 1
    kept = [first.select(keep_B)]
    n_kept, rounds = kept[0].batch_size, 1
    while n_kept < rows and rounds < max_rounds:
        more = sample_more()
        rounds += 1
        keep_B = mixed_rows(more)
        kept.append(more.select(keep_B))
        n_kept += kept[-1].batch_size
    if n_kept < rows:
        raise RuntimeError(
            f"mixed-group resampling could not fill the batch: {n_kept} of {rows} rows after "
            f"{rounds} generation rounds; raise --max_fill_rounds, use a larger --group_size, "
            "or turn --fill_batch off")
    index_B = torch.arange(rows, device=first.completion_tokens_BT.device)
    return concat_rollouts(kept).select(index_B), rounds
