"""Plumbing shared by the line-based environments (``guess_number``, ``twenty_questions``,
``calculator_tool``): byte-level token ids (`rlscope.tokenizer.ByteTokenizer`, ids 0..255),
one policy turn = one line ended by the newline byte (`NEWLINE`, the turn's stop token), and the
reward of an episode solved after some turns.

A turn the sampler cut on its per-turn token budget reaches the environment without its newline;
the line environments treat it as malformed and start their answer with a newline, so the
transcript stays one exchange per line.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlscope.tokenizer import ByteTokenizer

NEWLINE = 10
"""The newline byte: ends a policy turn in the line environments (as in the text tasks)."""
MIN_SOLVED_REWARD = 0.1
"""A solved episode earns at least this much, so finding the answer late beats never finding
it."""
TOKENIZER = ByteTokenizer()
"""The byte tokenizer of the line environments (no special tokens, vocabulary 256)."""


def encode(text: str) -> tuple[int, ...]:
    """``text`` as byte token ids."""
    return tuple(TOKENIZER.encode(text))


def read_line(action: Sequence[int], tokenizer: ByteTokenizer = TOKENIZER,
              stop_id: int = NEWLINE) -> tuple[str, bool]:
    """``(text, terminated)``: the decoded ids of ``action`` before its first ``stop_id`` (all
    of them, ``terminated`` False, when it has none). Ids outside the vocabulary and special
    tokens are dropped and invalid UTF-8 becomes U+FFFD, so this never raises on sampled ids."""
    ids = [int(i) for i in action]
    terminated = stop_id in ids
    if terminated:
        ids = ids[:ids.index(stop_id)]
    return tokenizer.decode(i for i in ids if 0 <= i < 256), terminated


def solved_reward(turns: int, turn_penalty: float) -> float:
    """Reward of an episode solved on policy turn ``turns`` (1-based, malformed turns count):
    ``max(MIN_SOLVED_REWARD, 1 − turn_penalty · (turns − 1))``; 1 when ``turn_penalty`` is 0."""
    return max(MIN_SOLVED_REWARD, 1.0 - turn_penalty * (turns - 1))
