"""``teacher_student``: the two-view task of Pedagogical RL (COMPANIONS.md §3).

Content symbols 0..V−1 (V = ``--sum_vocab``), QUERY_SEP = V, HINT_SEP = V + 1: V + 2 symbols.
A prompt is a pair (x0, x1) with answer y = (x0 + x1) mod V, seen two ways:

- the student view ``[x0, x1, QUERY_SEP]`` (3 tokens);
- the teacher view ``[x0, x1, HINT_SEP, y, QUERY_SEP]`` (5 tokens: it is told the answer).

A completion is T = ``--completion_len`` tokens over all V + 2 symbols; the reward is 1 iff
the **last** one equals y (the earlier tokens are free scratch). Training prompts are uniform
over the V² pairs; evaluation uses every pair once (exhaustive). These are pure functions; the
``two_view`` step (`rlscope.steps.two_view`) samples and trains.
"""

from __future__ import annotations

import torch

NAME = "teacher_student"
SUMMARY = ("Two views of (x0 + x1) mod V: a teacher that sees the answer teaches a student "
           "that does not; reward on the last completion token (two_view step).")
STUDENT_VIEW_LEN = 3
TEACHER_VIEW_LEN = 5


def query_sep(vocab: int) -> int:
    """The id of QUERY_SEP, which ends both views: V."""
    return vocab


def hint_sep(vocab: int) -> int:
    """The id of HINT_SEP, which precedes the answer in the teacher view: V + 1."""
    return vocab + 1


def num_symbols(vocab: int) -> int:
    """The models' vocabulary: V content symbols and the two separators."""
    return vocab + 2


def max_len(completion_len: int) -> int:
    """The longest sequence a model reads: the teacher view and a completion (8 at T = 3)."""
    return TEACHER_VIEW_LEN + completion_len


def answers_B(pairs_B2: torch.Tensor, vocab: int) -> torch.Tensor:
    """y = (x0 + x1) mod V per pair, ``[B]``."""
    return (pairs_B2[:, 0] + pairs_B2[:, 1]) % vocab


def student_view_BP(pairs_B2: torch.Tensor, vocab: int) -> torch.Tensor:
    """``[x0, x1, QUERY_SEP]`` per pair, ``[B, 3]`` long."""
    sep_B1 = torch.full_like(pairs_B2[:, :1], query_sep(vocab))
    return torch.cat([pairs_B2, sep_B1], dim=1)


def teacher_view_BQ(pairs_B2: torch.Tensor, vocab: int) -> torch.Tensor:
    """``[x0, x1, HINT_SEP, y, QUERY_SEP]`` per pair, ``[B, 5]`` long."""
    hint_B1 = torch.full_like(pairs_B2[:, :1], hint_sep(vocab))
    sep_B1 = torch.full_like(pairs_B2[:, :1], query_sep(vocab))
    return torch.cat([pairs_B2, hint_B1, answers_B(pairs_B2, vocab)[:, None], sep_B1], dim=1)


def last_token_rewards_B(completion_BT: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
    """R = 1 iff the last completion token equals the answer, float ``[B]``."""
    return (completion_BT[:, -1] == answers).float()


def all_pairs(vocab: int) -> torch.Tensor:
    """Every pair once, ``[V², 2]`` in row-major order (x0 slow, x1 fast): the evaluation set."""
    x_N = torch.arange(vocab)
    return torch.stack([x_N.repeat_interleave(vocab), x_N.repeat(vocab)], dim=1)


def sample_pairs(generator: torch.Generator, n: int, vocab: int) -> torch.Tensor:
    """``n`` pairs drawn uniformly from the V² pairs, ``[n, 2]``."""
    return torch.randint(0, vocab, (n, 2), generator=generator)


__all__ = ["NAME", "SUMMARY", "all_pairs", "answers_B", "hint_sep", "last_token_rewards_B",
           "max_len", "num_symbols", "query_sep", "sample_pairs", "student_view_BP",
           "teacher_view_BQ"]
