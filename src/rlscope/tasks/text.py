"""Plumbing shared by the byte-level text tasks (``arithmetic``, ``length_target``,
``preference_rm``; ``code_unit_tests`` adds one special token).

Prompts are UTF-8 text, tokenised by `rlscope.tokenizer.ByteTokenizer` (ids 0..255, no
specials) and left-padded with the NUL byte to the task's fixed ``prompt_len``, with an
attention mask, so every batch of a task (training or held-out) has the same width. A
completion ends at its first newline byte (`STOP_ID`, the task's stop token): its text is the
sampled ids before that stop, decoded once for scoring only (training uses the sampled ids).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlscope.batch import PromptBatch, RolloutBatch
from rlscope.tasks.base import TaskTraits
from rlscope.tokenizer import ByteTokenizer

STOP_ID = 10
"""The newline byte: the stop token of the text tasks."""
PAD_ID = 0
"""The NUL byte: left padding of prompts (masked out, never attended)."""
TEXT_OPTIONS = ("vocab", "seq_len", "score_len", "binary_reward", "context_len",
                "lm_kl_shaping")
"""`TaskConfig` fields of the token sandbox and lm_bandit, which no text task reads."""


def text_traits(binary_rewards: bool = False) -> TaskTraits:
    """The traits of a byte-level text task: the newline ends a completion (unless
    --stop_token_ids is given); rewards never decompose over tokens."""
    return TaskTraits(stop_token_ids=(STOP_ID,), binary_rewards=binary_rewards)


def fixed_left_padded(prompts: Sequence[Sequence[int]], width: int) -> PromptBatch:
    """Token-id prompts as one ``[B, width]`` batch, left-padded with `PAD_ID`, with its
    attention mask (1 on real tokens); a prompt longer than ``width`` is a ValueError."""
    tokens_BP = torch.full((len(prompts), width), PAD_ID, dtype=torch.long)
    mask_BP = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, ids in enumerate(prompts):
        if not 0 < len(ids) <= width:
            raise ValueError(f"prompt of {len(ids)} tokens does not fit the width {width}")
        tokens_BP[i, width - len(ids):] = torch.tensor(list(ids), dtype=torch.long)
        mask_BP[i, width - len(ids):] = 1
    return PromptBatch(tokens_BP=tokens_BP, attention_mask_BP=mask_BP)


def stop_padded(completions: Sequence[Sequence[int]], width: int) -> torch.Tensor:
    """``[B, width]`` long: each completion's ids, right-padded with `STOP_ID` (the targets of
    the text tasks: padding past a stop is never generated and never scored)."""
    out_BT = torch.full((len(completions), width), STOP_ID, dtype=torch.long)
    for i, ids in enumerate(completions):
        out_BT[i, :len(ids)] = torch.tensor(list(ids)[:width], dtype=torch.long)
    return out_BT


def prompt_texts(batch: RolloutBatch, tokenizer: ByteTokenizer) -> list[str]:
    """The decoded prompt of each row (padding dropped through the attention mask)."""
    texts = []
    for i in range(batch.batch_size):
        ids = batch.prompt_tokens_BP[i]
        if batch.prompt_mask_BP is not None:
            ids = ids[batch.prompt_mask_BP[i].bool()]
        texts.append(tokenizer.decode(ids.tolist()))
    return texts


def completion_ids(batch: RolloutBatch) -> list[list[int]]:
    """The counted ids of each row's completion (through the first stop token, if any)."""
    tokens_BT = batch.completion_tokens_BT.cpu()
    lengths_B = batch.completion_mask_BT.sum(-1).long().cpu()
    return [tokens_BT[i, :int(lengths_B[i])].tolist() for i in range(batch.batch_size)]


def text_before_stop(ids: Sequence[int], tokenizer: ByteTokenizer) -> tuple[str, bool]:
    """``(text, terminated)``: the decoded ids before the first `STOP_ID` (all of them when
    there is none, ``terminated`` False). Invalid UTF-8 becomes U+FFFD and ids outside the byte
    range are dropped, so this never raises on sampled ids."""
    ids = [int(i) for i in ids]
    terminated = STOP_ID in ids
    if terminated:
        ids = ids[:ids.index(STOP_ID)]
    return tokenizer.decode(i for i in ids if 0 <= i < tokenizer.vocab_size), terminated
