"""Candidate sampling for token-level update rules (TASKS.md, "Candidate sampling").

At every generated position of a behaviour rollout, K next-token candidates are drawn with
replacement from the behaviour policy given the behaviour prefix. Candidate 0 is the behaviour
token itself (the one that extends the prefix); candidates 1..K−1 are fresh draws. Each
candidate gets a dense reward from the task's targets: 1 if it equals the target at that
step, 0 otherwise, and 0 at unscored positions.
"""

from __future__ import annotations

import torch

from rlscope.batch import CandidateBatch, RolloutBatch
from rlscope.policy.base import Policy
from rlscope.sampling.processors import SampledDistribution, gumbel_offsets

UNPROCESSED = SampledDistribution()
"""Temperature 1, the rollout's kept set replayed (the default of `sample_candidates`)."""

_CANDIDATE_STRIDE = 0x2545F4914F6CDD1D  # odd: spreads candidate streams across seeds


@torch.no_grad()
def sample_candidates(policy: Policy, batch: RolloutBatch, num_candidates: int,
                      generator: torch.Generator,
                      dist: SampledDistribution = UNPROCESSED) -> CandidateBatch:
    """``num_candidates`` (K) candidates at each of the T positions of ``batch``.

    The behaviour distribution at each prefix is recomputed by one teacher-forced forward with
    the sampler's processing, ``dist`` (temperature; the rollout's top-k/top-p kept set when
    ``dist.replay_keep``), so candidates come from the distribution the behaviour token came from.
    Shapes: ``[B, T, K]`` candidates, old log-probs and rewards.
    """
    if num_candidates < 1:
        raise ValueError(f"num_candidates={num_candidates} must be >= 1")
    if batch.targets_BT is None:
        raise ValueError("candidate rewards need the task's targets (targets_BT)")
    B, T = batch.completion_tokens_BT.shape
    P = batch.prompt_len
    tokens_BL, mask_BL = batch.full_tokens()
    logits_BTV = policy.forward(tokens_BL, mask_BL)[0][:, P - 1:P - 1 + T]
    logp_BTV = dist.logprobs(logits_BTV, batch.keep_mask_BTV)
    device = logp_BTV.device
    seeds_B = torch.randint(0, 2**62, (B,), generator=generator).to(device)
    extra = num_candidates - 1
    candidates = [batch.completion_tokens_BT[..., None]]
    if extra:
        seeds_BTk = (seeds_B[:, None, None]
                     + _CANDIDATE_STRIDE * torch.arange(1, extra + 1, device=device)[None, None])
        steps_BTk = torch.arange(T, device=device)[None, :, None]
        offsets_BTkV = gumbel_offsets(seeds_BTk, steps_BTk, logp_BTV.shape[-1])
        candidates.append((logp_BTV[:, :, None] - offsets_BTkV).argmax(-1))
    candidates_BTK = torch.cat(candidates, -1)
    logp_old_BTK = logp_BTV.gather(-1, candidates_BTK)
    score_BT = batch.score_mask_BT if batch.score_mask_BT is not None \
        else torch.ones_like(batch.completion_mask_BT)
    valid_BT = batch.completion_mask_BT * score_BT.to(batch.completion_mask_BT.dtype)
    rewards_BTK = (candidates_BTK == batch.targets_BT[..., None]).to(logp_BTV.dtype) \
        * valid_BT[..., None]
    return CandidateBatch(rollout=batch, candidates_BTK=candidates_BTK,
                          logp_old_BTK=logp_old_BTK, rewards_BTK=rewards_BTK,
                          mask_BT=batch.completion_mask_BT)
