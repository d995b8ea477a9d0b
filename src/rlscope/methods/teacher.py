"""The `Teacher` protocol of the distillation presets (``opd``, ``gkd``; METHODS_2026.md §3 and
COMPANIONS.md §1) and its frozen-policy implementation.

A teacher scores the **student's** sampled completions: ``logp_BTV(batch)`` returns its
log-probabilities over the vocabulary at every completion position of the batch (the prefix is
the prompt plus the student's own tokens before it), ``[B, T, V]``, detached. The advantage
``teacher_rkl`` reads the sampled token's log-prob ℓ_T (`sampled_logp_BT`); the objective
``gkd_jsd`` reads the whole distribution, which a teacher that returns only its top-k
log-probs cannot give (``full_distribution`` False: rejected by `teacher_errors`).

The built-in teacher is a frozen policy (`PolicyTeacher`): an rlscope checkpoint of the
student's architecture, or a local Hugging Face directory of the same tokenizer
(``--teacher_path``, built by `rlscope.train.load_teacher`). Other teachers (the companion
presets' oracles) implement the same protocol and register a builder in the loop. The task
tokenizes prompts and completions for both models, so a teacher of the student's vocabulary
size reads exactly the student's token ids (the "same tokenizer" of METHODS_2026.md §4).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from rlscope.batch import RolloutBatch
from rlscope.policy.base import Policy


@dataclass(frozen=True)
class TeacherConfig:
    """The teacher of the distillation presets (``opd``, ``gkd``)."""

    teacher_path: str = ""
    """Frozen teacher policy: an rlscope checkpoint file, a training run or ``rlscope sft``
    directory of the student's architecture and task (as ``--init`` reads), or a local
    Hugging Face model directory with the student's tokenizer (its config.json marks it).
    Needed by the presets whose components read a teacher (opd, gkd); empty = none."""


@runtime_checkable
class Teacher(Protocol):
    """A frozen scorer of the student's samples (see the module docstring)."""

    @property
    def vocab_size(self) -> int:
        """Size V of the distributions it returns (must equal the student's)."""
        ...

    @property
    def full_distribution(self) -> bool:
        """Whether ``logp_BTV`` is the whole distribution (False: top-k log-probs only, the
        rest −inf)."""
        ...

    def logp_BTV(self, batch: RolloutBatch) -> torch.Tensor:
        """Log-probs ``[B, T, V]`` at each completion position of ``batch``, detached."""
        ...


class PolicyTeacher:
    """A frozen policy as a teacher: one no-grad teacher-forced forward over the prompt and the
    student's completion, log-softmax of the logits at temperature 1 (the teacher's own
    distribution, whatever the student sampled with), in at least float32."""

    full_distribution = True

    def __init__(self, policy: Policy) -> None:
        self.policy = policy.requires_grad_(False).eval()  # type: ignore[attr-defined]

    @property
    def vocab_size(self) -> int:
        return int(self.policy.vocab_size)

    @torch.no_grad()
    def logp_BTV(self, batch: RolloutBatch) -> torch.Tensor:
        tokens_BT = batch.completion_tokens_BT
        P, T = batch.prompt_len, tokens_BT.shape[1]
        full_BL = torch.cat([batch.prompt_tokens_BP, tokens_BT], 1)
        mask_BL = None
        if batch.prompt_mask_BP is not None:
            mask_BL = torch.cat([batch.prompt_mask_BP, torch.ones_like(tokens_BT)], 1)
        logits_BLV, _ = self.policy.forward(full_BL, mask_BL)
        logits_BTV = logits_BLV[:, P - 1:P - 1 + T]
        dtype = torch.promote_types(logits_BTV.dtype, torch.float32)
        return logits_BTV.to(dtype).log_softmax(-1)


def sampled_logp_BT(logp_BTV: torch.Tensor, tokens_BT: torch.Tensor) -> torch.Tensor:
    """ℓ_T: the teacher's log-prob of each sampled token, ``[B, T]``."""
    return logp_BTV.gather(-1, tokens_BT[..., None]).squeeze(-1)


def teacher_errors(teacher: Teacher, student_vocab: int, needs_distribution: bool) -> list[str]:
    """Why ``teacher`` cannot teach this student (empty when it can): another vocabulary
    (METHODS_2026.md §4: the tokenizers must be equal), or top-k log-probs only where the
    objective needs the whole distribution (``gkd_jsd``)."""
    errors = []
    if teacher.vocab_size != student_vocab:
        errors.append(f"teacher.teacher_path: the teacher's vocabulary ({teacher.vocab_size}) "
                      f"differs from the student's ({student_vocab}); use a teacher of the "
                      "same tokenizer")
    if needs_distribution and not teacher.full_distribution:
        errors.append("teacher.teacher_path: this method's objective needs the teacher's full "
                      "distribution (full logits), but the teacher gives top-k log-probs only")
    return errors
