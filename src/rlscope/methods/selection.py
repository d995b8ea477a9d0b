"""Sample selection before the update (METHODS.md, "Selection").

`mixed_groups` (dynamic sampling, DAPO arXiv:2503.14476): keep only groups whose reward std is
above 1e-6. If no group survives, keep everything and report a fallback.
"""

from __future__ import annotations

import torch

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
