"""The packed learner for Hugging Face policies: no padding tokens, no B×T×V logits.

The padded learner (`rlscope.learner.forward_completion`) runs ``[B, P + T]`` left-padded rows
through the model and computes float32 logits at every completion position: ``B·T·V`` numbers
(10 GB for 16k tokens at a 152k vocabulary) and attention and MLP work on every padding token.
For a `rlscope.policy.hf.HFPolicy` this module does the same teacher-forced forward

1. **packed**: each row's real prompt tokens and its completion up to its last loss position,
   concatenated into one ``[1, N]`` sequence with per-row restarting position ids, so attention
   stays inside each row (`HFPolicy.final_hidden`) and no padding token is computed;
2. with **chunked log-probs**: the log-prob and entropy of the chosen tokens from the final
   hidden states, ``logprob_chunk`` positions at a time (`rlscope.policy.chunked`), so the
   full logits never exist.

Results are unpacked to the learner's ``[B, T]`` completion layout; only positions before a
row's last loss position are computed (the others hold the behaviour log-prob, entropy 0 and
hidden state 0 and are masked by every reader). Chunked log-probs apply only when the method
reads per-token quantities alone (`rlscope.methods.spec.MethodSpec.reads_learner_distribution`
is False) and the sampler's distribution has no replayed top-k/top-p kept set; otherwise the
packed forward computes the full distribution at the packed positions (`PackedForward.logp_BTV`).

`token_budget_slices` groups rows into micro-batches by token count (``--learner.token_budget``).
The options are `rlscope.config.LearnerConfig` (``--learner.*``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from rlscope.batch import RolloutBatch
from rlscope.config import LearnerConfig
from rlscope.methods.regularizers import entropy_from_logp
from rlscope.methods.spec import MethodSpec
from rlscope.policy.base import Policy
from rlscope.policy.chunked import chunked_logp_entropy
from rlscope.sampling.processors import SampledDistribution

__all__ = ["PackedForward", "PackedLearner", "packed_forward",
           "resolve_learner", "row_token_counts", "token_budget_slices"]


@dataclass(frozen=True)
class PackedLearner:
    """The packed learner's options in force for a run (resolved by `resolve_learner`)."""

    packing: bool = True
    """Pack rows without padding (else the padded left-aligned forward)."""
    logprob_chunk: int = 1024
    """Positions per chunk of the chunked log-probs where the method allows (0 = off)."""


def resolve_learner(cfg: LearnerConfig, policy: Policy) -> PackedLearner | None:
    """The packed learner for ``policy`` under ``cfg``, or None for the padded learner (the
    tiny transformer, a model whose logits are not a plain linear head, or both off). Raises
    ValueError for ``packing="on"`` where it cannot apply."""
    if not hasattr(policy, "final_hidden") or policy.output_head() is None:  # type: ignore[attr-defined]
        if cfg.packing == "on":
            raise ValueError("learner.packing=on needs a Hugging Face policy whose logits are "
                             "a plain linear head of the final hidden state; use "
                             "--learner.packing auto")
        return None
    packing = cfg.packing != "off"
    if not packing and cfg.logprob_chunk == 0:
        return None
    return PackedLearner(packing=packing, logprob_chunk=cfg.logprob_chunk)


@dataclass(frozen=True)
class PackedForward:
    """The teacher-forced forward at the completion positions, ``[B, T]`` layout. Positions at
    or after a row's last loss position hold ``logp_BT`` = the behaviour log-prob,
    ``entropy_BT`` = 0, ``hidden_BTD`` = 0 (and a uniform ``logp_BTV``)."""

    logp_BT: torch.Tensor
    entropy_BT: torch.Tensor
    hidden_BTD: torch.Tensor
    logp_BTV: torch.Tensor | None
    """The processed distribution, only when it was asked for (no chunking)."""


def chunk_applies(spec: MethodSpec, batch: RolloutBatch, dist: SampledDistribution) -> bool:
    """Whether the chosen tokens' log-probs and entropies are all the loss reads: the method
    reads no whole distribution and no replayed kept set restricts the vocabulary."""
    return not spec.reads_learner_distribution and not (
        dist.replay_keep and batch.keep_mask_BTV is not None)


def row_token_counts(batch: RolloutBatch, mask_BT: torch.Tensor) -> torch.Tensor:
    """``[B]`` tokens each row costs packed: its real prompt tokens plus its completion up to
    its last loss position (the last completion token itself is never an input); 0 for a row
    without loss positions."""
    P, T = batch.prompt_len, mask_BT.shape[1]
    prompt_B = (torch.full((batch.batch_size,), P, device=mask_BT.device)
                if batch.prompt_mask_BP is None else batch.prompt_mask_BP.long().sum(-1))
    t_T = torch.arange(1, T + 1, device=mask_BT.device)
    loss_len_B = ((mask_BT != 0) * t_T).amax(-1) if T else torch.zeros_like(prompt_B)
    return torch.where(loss_len_B > 0, prompt_B + loss_len_B - 1, 0)


def _loss_positions(mask_BT: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` bool: completion positions up to each row's last loss position."""
    T = mask_BT.shape[1]
    t_T = torch.arange(1, T + 1, device=mask_BT.device)
    loss_len_B = ((mask_BT != 0) * t_T).amax(-1)
    return t_T[None, :] <= loss_len_B[:, None]


def packed_forward(policy: Any, options: PackedLearner, batch: RolloutBatch,
                   tokens_BT: torch.Tensor, mask_BT: torch.Tensor, logp_old_BT: torch.Tensor,
                   dist: SampledDistribution, chunked: bool) -> PackedForward | None:
    """The learner's forward through ``policy`` (an `HFPolicy`) at the positions up to each
    row's last loss position (``mask_BT``), packed when ``options.packing``, with chunked
    log-probs when ``chunked`` (see `chunk_applies`). None when no row has a loss position
    (the caller then runs the padded forward, whose loss still has a graph)."""
    P, T = batch.prompt_len, tokens_BT.shape[1]
    valid_BT = _loss_positions(mask_BT)
    if not bool(valid_BT.any()):
        return None
    full_BL = torch.cat([batch.prompt_tokens_BP, tokens_BT], 1)
    prompt_BP = (torch.ones_like(batch.prompt_tokens_BP, dtype=torch.bool)
                 if batch.prompt_mask_BP is None else batch.prompt_mask_BP.bool())
    if bool((valid_BT.any(-1) & ~prompt_BP[:, -1]).any()):
        raise ValueError("the packed learner needs left-padded prompts with at least one "
                         "real token per row")
    # The hidden state at full position P - 1 + t predicts completion token t.
    if options.packing:
        # inputs: real prompt tokens and completion tokens before the last loss position
        keep_BL = torch.cat([prompt_BP, valid_BT[:, 1:], torch.zeros_like(valid_BT[:, :1])], 1)
        pos_BL = keep_BL.long().cumsum(-1) - 1
        hidden_1ND = policy.final_hidden(full_BL[keep_BL][None],
                                         position_ids_BT=pos_BL[keep_BL][None])
        index_BL = keep_BL.flatten().long().cumsum(0).view_as(keep_BL) - 1
        hidden_ND = hidden_1ND[0, index_BL[:, P - 1:P - 1 + T][valid_BT]]
    else:
        mask_BL = torch.cat([prompt_BP, torch.ones_like(valid_BT)], 1)
        hidden_BLD = policy.final_hidden(
            full_BL, None if batch.prompt_mask_BP is None else mask_BL)
        hidden_ND = hidden_BLD[:, P - 1:P - 1 + T][valid_BT]
    head = policy.output_head()
    assert head is not None  # resolve_learner checked it
    W_VD, bias_V = head
    tokens_N = tokens_BT[valid_BT]
    temperature = dist.temperature if dist.temperature > 0 else 1.0
    logp_BTV = None
    if chunked:
        logp_N, entropy_N = chunked_logp_entropy(hidden_ND, W_VD, bias_V, tokens_N,
                                                 temperature, options.logprob_chunk)
    else:
        logits_NV = torch.nn.functional.linear(hidden_ND.to(W_VD.dtype), W_VD, bias_V)
        keep_NV = None if batch.keep_mask_BTV is None else batch.keep_mask_BTV[valid_BT]
        logp_NV = dist.logprobs(logits_NV, keep_NV)
        logp_N = logp_NV.gather(-1, tokens_N[:, None]).squeeze(-1)
        entropy_N = entropy_from_logp(logp_NV)
        V = logp_NV.shape[-1]
        logp_BTV = torch.full((*valid_BT.shape, V), -math.log(V), dtype=logp_NV.dtype,
                              device=logp_NV.device).masked_scatter(
            valid_BT[..., None].expand(-1, -1, V), logp_NV)
    dtype = logp_N.dtype
    logp_BT = logp_old_BT.detach().to(dtype).masked_scatter(valid_BT, logp_N)
    entropy_BT = torch.zeros_like(logp_BT).masked_scatter(valid_BT, entropy_N)
    D = hidden_ND.shape[-1]
    hidden_BTD = hidden_ND.new_zeros(*valid_BT.shape, D).masked_scatter(
        valid_BT[..., None].expand(-1, -1, D), hidden_ND)
    return PackedForward(logp_BT, entropy_BT, hidden_BTD, logp_BTV)


def token_budget_slices(counts_B: torch.Tensor, start: int, stop: int, budget: int,
                        unit: int = 1) -> list[slice]:
    """Contiguous micro-batches of rows ``start:stop`` (in whole units of ``unit`` rows, e.g.
    groups an objective couples) whose summed ``counts_B`` stay within ``budget``; a unit
    larger than the budget forms a micro-batch alone. Covers every row once, in order."""
    if budget < 1 or unit < 1:
        raise ValueError(f"budget={budget} and unit={unit} must be >= 1")
    counts = counts_B[start:stop].tolist()
    slices: list[slice] = []
    begin, used = start, 0
    for s in range(start, stop, unit):
        cost = sum(counts[s - start:min(s + unit, stop) - start])
        if s > begin and used + cost > budget:
            slices.append(slice(begin, s))
            begin, used = s, 0
        used += cost
    if begin < stop:
        slices.append(slice(begin, stop))
    return slices
