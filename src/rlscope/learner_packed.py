"""The packed learner for Hugging Face policies: no padding tokens, no B×T×V logits.

The padded learner (`rlscope.learner.forward_completion`) runs ``[B, P + T]`` left-padded rows
through the model and computes float32 logits at every completion position: ``B·T·V`` numbers
(10 GB for 16k tokens at a 152k vocabulary) and attention and MLP work on every padding token.
For a `rlscope.policy.hf.HFPolicy` this module does the same teacher-forced forward

1. **packed**: each row's real prompt tokens and its completion up to its last loss position,
   concatenated with per-row restarting position ids, so attention stays inside each row
   (`HFPolicy.final_hidden`) and no padding token is computed: one ``[1, N]`` sequence for
   flash-attn's varlen kernels, else bins of the longest row's length (`pack_rows`), so the
   block-diagonal mask of SDPA/eager never costs more attention than the padded batch;
2. with **chunked log-probs**: the log-prob and entropy of the chosen tokens from the final
   hidden states, ``logprob_chunk`` positions at a time (`rlscope.policy.chunked`), so the
   full logits never exist.

Results are unpacked to the learner's ``[B, T]`` completion layout; only positions before a
row's last loss position are computed (the others hold the behaviour log-prob, entropy 0 and
hidden state 0 and are masked by every reader). Chunked log-probs apply only when the method
reads per-token quantities alone (`rlscope.methods.spec.MethodSpec.reads_learner_distribution`
is False) and the sampler's distribution has no replayed top-k/top-p kept set; otherwise the
packed forward computes the full distribution at the packed positions (`PackedForward.logp_BTV`).

`token_budget_slices` groups rows into micro-batches by token count (``--token_budget``). The
options are `rlscope.config.LearnerConfig` (``learner.*``: ``--packing``, ``--logprob_chunk``,
``--token_budget``, ``--activation_checkpointing``).
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
from rlscope.policy.base import Policy, head_dtype
from rlscope.policy.chunked import chunked_logp_entropy
from rlscope.sampling.processors import SampledDistribution

__all__ = ["PackedForward", "PackedLearner", "host_masks", "pack_rows", "packed_forward",
           "resolve_learner", "row_token_counts", "token_budget_slices"]


@dataclass(frozen=True)
class PackedLearner:
    """The packed learner's options in force for a run (resolved by `resolve_learner`)."""

    packing: bool = True
    """Pack rows without padding (else the padded left-aligned forward)."""
    logprob_chunk: int = 1024
    """Positions per chunk of the chunked log-probs where the method allows (0 = off)."""
    varlen: bool = False
    """Pack the whole micro-batch into one sequence (flash-attn's varlen kernels); else into
    bins of the longest row's length (SDPA or eager attention with a block-diagonal mask)."""


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
    packing = cfg.packing != "off" and packed_positions_supported()
    if cfg.packing == "on" and not packing:
        raise ValueError("learner.packing=on needs transformers >= 4.54 (it keeps attention "
                         "within packed rows from their position ids); upgrade it or use "
                         "--packing auto")
    if not packing and cfg.logprob_chunk == 0:
        return None
    attn = str(getattr(policy.unwrap().config, "_attn_implementation", ""))  # type: ignore[attr-defined]
    return PackedLearner(packing=packing, logprob_chunk=cfg.logprob_chunk,
                         varlen=attn.startswith("flash"))


def packed_positions_supported() -> bool:
    """Whether the installed transformers keeps attention within rows packed into one
    sequence, detected from restarting position ids (``masking_utils``, transformers >=
    4.54); older versions would attend across rows, so packing stays off there."""
    try:
        from transformers import masking_utils
    except ImportError:
        return False
    return hasattr(masking_utils, "find_packed_sequence_indices")


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


def chunkable(batch: RolloutBatch, dist: SampledDistribution) -> bool:
    """Whether the distribution is softmax over the whole vocabulary (no replayed top-k/top-p
    kept set), which is what `chunked_logp_entropy` computes."""
    return not (dist.replay_keep and batch.keep_mask_BTV is not None)


def chunk_applies(spec: MethodSpec, batch: RolloutBatch, dist: SampledDistribution) -> bool:
    """Whether the chosen tokens' log-probs and entropies are all the loss reads: the method
    reads no whole distribution and no replayed kept set restricts the vocabulary."""
    return not spec.reads_learner_distribution and chunkable(batch, dist)


def row_token_counts(batch: RolloutBatch, mask_BT: torch.Tensor) -> torch.Tensor:
    """``[B]`` tokens each row costs packed: its real prompt tokens plus its completion up to
    its last loss position (the last completion token itself is never an input); 0 for a row
    without loss positions."""
    prompt_B = (torch.full((batch.batch_size,), batch.prompt_len, device=mask_BT.device)
                if batch.prompt_mask_BP is None else batch.prompt_mask_BP.long().sum(-1))
    loss_len_B = _loss_positions(mask_BT).sum(-1)
    return torch.where(loss_len_B > 0, prompt_B + loss_len_B - 1, 0)


def _loss_positions(mask_BT: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` bool: completion positions up to each row's last loss position."""
    T = mask_BT.shape[1]
    t_T = torch.arange(1, T + 1, device=mask_BT.device)
    loss_len_B = ((mask_BT != 0) * t_T).amax(-1)
    return t_T[None, :] <= loss_len_B[:, None]


def host_masks(batch: RolloutBatch, mask_BT: torch.Tensor) -> torch.Tensor:
    """``[B, P + T]`` bool on the host: the prompt mask and ``mask_BT != 0``, what
    `packed_forward` plans its layout from. One device sync; `update` takes it once per update
    and hands each micro-batch its rows, so the micro-batches queue without waiting."""
    prompt_BP = (torch.ones_like(batch.prompt_tokens_BP, dtype=torch.bool)
                 if batch.prompt_mask_BP is None else batch.prompt_mask_BP.bool())
    return torch.cat([prompt_BP, mask_BT != 0], 1).cpu()


def packed_forward(policy: Any, options: PackedLearner, batch: RolloutBatch,
                   tokens_BT: torch.Tensor, mask_BT: torch.Tensor, logp_old_BT: torch.Tensor,
                   dist: SampledDistribution, chunked: bool,
                   masks_BL: torch.Tensor | None = None) -> PackedForward | None:
    """The learner's forward through ``policy`` (an `HFPolicy`) at the positions up to each
    row's last loss position (``mask_BT``), packed when ``options.packing``, with chunked
    log-probs when ``chunked`` (see `chunk_applies`). None when no row has a loss position
    (the caller then runs the padded forward, whose loss still has a graph). ``masks_BL``:
    these rows' `host_masks` when the caller has them (else read from the device here)."""
    P, T = batch.prompt_len, tokens_BT.shape[1]
    B, L = tokens_BT.shape[0], P + T
    device = tokens_BT.device
    # The layout is planned on the host from one copy of the masks (the only device sync,
    # none when the caller has it), and reaches the device as index tensors: no boolean
    # indexing on the device.
    if masks_BL is None:
        masks_BL = host_masks(batch, mask_BT)
    elif masks_BL.shape != (B, L) or masks_BL.device.type != "cpu":
        raise ValueError(f"masks_BL must be these rows' host_masks, [{B}, {L}] on the CPU; got "
                         f"{tuple(masks_BL.shape)} on {masks_BL.device}")
    prompt_cpu_BP, valid_cpu_BT = masks_BL[:, :P], _loss_positions(masks_BL[:, P:])
    if not bool(valid_cpu_BT.any()):
        return None
    if bool((valid_cpu_BT.any(-1) & ~prompt_cpu_BP[:, -1]).any()):
        raise ValueError("the packed learner needs left-padded prompts with at least one "
                         "real token per row")
    valid_N = valid_cpu_BT.reshape(-1).nonzero().squeeze(1)  # flat [B·T] indices, row-major
    b_N, t_N = valid_N // T, valid_N % T
    full_BL = torch.cat([batch.prompt_tokens_BP, tokens_BT], 1)
    # The hidden state at full position P - 1 + t predicts completion token t.
    if options.packing:
        # inputs: real prompt tokens and completion tokens before the last loss position
        # (a row without a loss position contributes nothing: none of its tokens go in)
        keep_BL = torch.cat([prompt_cpu_BP & valid_cpu_BT.any(-1, keepdim=True),
                             valid_cpu_BT[:, 1:], torch.zeros_like(valid_cpu_BT[:, :1])], 1)
        pos_BL = keep_BL.long().cumsum(-1) - 1
        bin_B, start_B, R, C = pack_rows(keep_BL.sum(-1).tolist(), options.varlen)
        src_M = keep_BL.reshape(-1).nonzero().squeeze(1)  # kept tokens, flat [B·L]
        b_M = src_M // L
        pos_M = pos_BL.reshape(-1)[src_M]
        dst_M = bin_B[b_M] * C + start_B[b_M] + pos_M  # their flat [R·C] places
        # a bin's unused tail is one more sequence (positions from 0), never attended to
        # by the rows: it costs its tokens but keeps every row's attention its own
        used_R = torch.zeros(R, dtype=torch.long).index_add_(0, bin_B[b_M],
                                                             torch.ones_like(b_M))
        pos_RC = (torch.arange(C)[None] - used_R[:, None]).clamp_min(0)
        pos_RC.view(-1)[dst_M] = pos_M
        out_N = bin_B[b_N] * C + start_B[b_N] + pos_BL[b_N, P - 1 + t_N]
        tokens_RC = full_BL.new_zeros(R * C).index_copy_(
            0, _to_device(dst_M, device), full_BL.reshape(-1)[_to_device(src_M, device)])
        hidden_RCD = policy.final_hidden(tokens_RC.view(R, C),
                                         position_ids_BT=_to_device(pos_RC, device))
        hidden_ND = hidden_RCD.reshape(R * C, -1).index_select(0, _to_device(out_N, device))
    else:
        prompt_BP = (torch.ones_like(batch.prompt_tokens_BP, dtype=torch.bool)
                     if batch.prompt_mask_BP is None else batch.prompt_mask_BP.bool())
        mask_BL = torch.cat([prompt_BP, torch.ones_like(tokens_BT, dtype=torch.bool)], 1)
        hidden_BLD = policy.final_hidden(
            full_BL, None if batch.prompt_mask_BP is None else mask_BL)
        hidden_ND = hidden_BLD.reshape(B * L, -1).index_select(
            0, _to_device(b_N * L + P - 1 + t_N, device))
    valid_dev_N = _to_device(valid_N, device)
    head = policy.output_head()
    assert head is not None  # resolve_learner checked it
    W_VD, bias_V = head
    tokens_N = tokens_BT.reshape(-1).index_select(0, valid_dev_N)
    temperature = dist.temperature if dist.temperature > 0 else 1.0
    logp_BTV = None
    if chunked:
        logp_N, entropy_N = chunked_logp_entropy(
            hidden_ND, W_VD, bias_V, tokens_N, temperature, options.logprob_chunk,
            head_dtype(policy))
    else:
        mixed = head_dtype(policy)  # None: no autocast, or an fp32 head (--fp32_head)
        with torch.autocast(hidden_ND.device.type, dtype=mixed or torch.bfloat16,
                            enabled=mixed is not None, cache_enabled=False):
            logits_NV = torch.nn.functional.linear(hidden_ND.to(W_VD.dtype), W_VD, bias_V)
        keep_NV = None if batch.keep_mask_BTV is None else \
            batch.keep_mask_BTV.reshape(B * T, -1).index_select(0, valid_dev_N)
        logp_NV = dist.logprobs(logits_NV, keep_NV)
        logp_N = logp_NV.gather(-1, tokens_N[:, None]).squeeze(-1)
        entropy_N = entropy_from_logp(logp_NV)
        V = logp_NV.shape[-1]
        logp_BTV = torch.full((B * T, V), -math.log(V), dtype=logp_NV.dtype,
                              device=device).index_copy(0, valid_dev_N, logp_NV).view(B, T, V)
    dtype = logp_N.dtype
    logp_BT = logp_old_BT.detach().to(dtype).reshape(-1).index_copy(
        0, valid_dev_N, logp_N).view(B, T)
    entropy_BT = logp_N.new_zeros(B * T).index_copy(0, valid_dev_N, entropy_N).view(B, T)
    hidden_BTD = hidden_ND.new_zeros(B * T, hidden_ND.shape[-1]).index_copy(
        0, valid_dev_N, hidden_ND).view(B, T, -1)
    return PackedForward(logp_BT, entropy_BT, hidden_BTD, logp_BTV)


def _to_device(index_N: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host index tensor on ``device``, without waiting for the device's queue (pinned
    memory, asynchronous copy, on CUDA)."""
    if device.type != "cuda":
        return index_N.to(device)
    return index_N.pin_memory().to(device, non_blocking=True)


def pack_rows(lengths: list[int], one_row: bool) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """Where each row goes in the packed ``[R, C]`` layout: ``(bin_B, start_B, R, C)``, the
    bin (packed row) of every row (-1 for an empty row) and its first column.

    ``one_row``: every row in one sequence, ``C`` = the total (flash-attn's varlen kernels
    cost each row only its own length). Otherwise first-fit decreasing into bins of the
    longest row's length, so attention through a block-diagonal mask (SDPA, eager) costs at
    most the padded batch's R·C² instead of (ΣC)², while the other layers skip the padding.
    """
    B = len(lengths)
    bin_B, start_B = [-1] * B, [0] * B
    if one_row:
        used = 0
        for b, n in enumerate(lengths):
            if n:
                bin_B[b], start_B[b], used = 0, used, used + n
        return torch.tensor(bin_B), torch.tensor(start_B), 1, max(used, 1)
    C = max(max(lengths, default=0), 1)
    used_R: list[int] = []
    for b in sorted(range(B), key=lambda i: -lengths[i]):
        n = lengths[b]
        if not n:
            continue
        r = next((r for r, u in enumerate(used_R) if u + n <= C), len(used_R))
        if r == len(used_R):
            used_R.append(0)
        bin_B[b], start_B[b] = r, used_R[r]
        used_R[r] += n
    return torch.tensor(bin_B), torch.tensor(start_B), max(len(used_R), 1), C


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
