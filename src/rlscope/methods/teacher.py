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

import math
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
    teacher: str = "oracle"
    """Built-in analytic teacher of the OPD presets (opd_reverse_kl, opd_topk_reverse_kl,
    opd_pg; COMPANIONS.md §1), a function of each position's target y_t: ``oracle`` (1 − ε on
    y_t, ε/(A − 1) elsewhere; any task with targets) or ``soft`` (weights exp(−d(a, y_t)/T) by
    cyclic distance; token_reversal only)."""
    teacher_epsilon: float = 1e-3
    """ε of the ``oracle`` teacher, in (0, 1): the mass spread over the A − 1 wrong actions."""
    teacher_temperature: float = 1.0
    """T > 0 of the ``soft`` teacher: smaller is sharper around the target."""
    special_token_weight: float = 0.02
    """Unnormalised weight > 0 of the ``soft`` teacher on each special token (SEP)."""
    overlap_k: int = 2
    """k of the OPD evaluation diagnostic ``eval/overlap_at_k`` = |top-k(π) ∩ top-k(π_T)|/k,
    in [1, A]."""


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


TEACHERS = ("oracle", "soft")
"""The built-in analytic teachers (`TargetTeacher`)."""

SOFT_TIE = 1e-3
"""Tie factor of the ``soft`` teacher: content weights × (1 + SOFT_TIE·(V − 1 − a)/V), so of
two actions at the same cyclic distance the lower id weighs more (COMPANIONS.md §1, choice)."""


def oracle_logp_BTV(targets_BT: torch.Tensor, num_actions: int, epsilon: float) -> torch.Tensor:
    """The ``oracle`` teacher: log(1 − ε) at a = y_t, log(ε/(A − 1)) elsewhere, ``[B, T, A]``."""
    off = math.log(epsilon / (num_actions - 1))
    logp_BTV = torch.full((*targets_BT.shape, num_actions), off)
    return logp_BTV.scatter(-1, targets_BT[..., None].cpu(), math.log1p(-epsilon))


def soft_logp_BTV(targets_BT: torch.Tensor, num_actions: int, content_vocab: int,
                  temperature: float, special_weight: float) -> torch.Tensor:
    """The ``soft`` teacher: log(w_a / Σ_b w_b) with, for a content action a < V,
    w_a = exp(−d(a, y_t)/T)·(1 + 1e-3·(V − 1 − a)/V), d the cyclic distance
    min(|a − y|, V − |a − y|), and w = ``special_weight`` for the specials a ≥ V; ``[B, T, A]``."""
    V = content_vocab
    a_A = torch.arange(num_actions, dtype=torch.float64)
    y_BT1 = targets_BT[..., None].cpu().to(torch.float64)
    gap_BTA = (a_A - y_BT1).abs()
    dist_BTA = torch.minimum(gap_BTA, V - gap_BTA)
    tie_A = 1.0 + SOFT_TIE * (V - 1 - a_A) / V
    w_BTA = torch.where(a_A < V, torch.exp(-dist_BTA / temperature) * tie_A,
                        torch.full_like(dist_BTA, special_weight))
    return (w_BTA / w_BTA.sum(-1, keepdim=True)).log().to(torch.float32)


@dataclass(frozen=True)
class TargetTeacher:
    """A built-in teacher over the task's targets (``--teacher``): its distribution at position
    t depends only on the label y_t (``batch.targets_BT``), not on the student's prefix; so it
    is exact at every visited prefix."""

    kind: str
    num_actions: int
    """A: the student's vocabulary (token_reversal: V + 1 with SEP)."""
    content_vocab: int
    """V: the content alphabet (``soft`` only: its cyclic distance and tie factor)."""
    epsilon: float = 1e-3
    temperature: float = 1.0
    special_weight: float = 0.02
    full_distribution = True

    @property
    def vocab_size(self) -> int:
        return self.num_actions

    def logp_targets_BTV(self, targets_BT: torch.Tensor) -> torch.Tensor:
        """Log-probs ``[B, T, A]`` for the labels ``targets_BT``, on their device."""
        if self.kind == "oracle":
            out = oracle_logp_BTV(targets_BT, self.num_actions, self.epsilon)
        else:
            out = soft_logp_BTV(targets_BT, self.num_actions, self.content_vocab,
                                self.temperature, self.special_weight)
        return out.to(targets_BT.device)

    def logp_BTV(self, batch: RolloutBatch) -> torch.Tensor:
        if batch.targets_BT is None:
            raise ValueError("a built-in teacher (--teacher) reads the task's targets, which "
                             "this batch lacks: use a task with labels")
        return self.logp_targets_BTV(batch.targets_BT)


def builtin_teacher_errors(cfg: TeacherConfig, task_name: str, num_actions: int) -> list[str]:
    """Why the built-in teacher settings cannot run (COMPANIONS.md §1, "Validation"), each
    saying what to change; ``num_actions`` is A, the student's vocabulary."""
    errors = []
    if cfg.teacher not in TEACHERS:
        errors.append(f"teacher.teacher={cfg.teacher!r} is unknown; valid: "
                      f"{', '.join(TEACHERS)}")
    if not 0 < cfg.teacher_epsilon < 1:
        errors.append(f"teacher.teacher_epsilon={cfg.teacher_epsilon} must lie in (0, 1)")
    if cfg.teacher_temperature <= 0:
        errors.append(f"teacher.teacher_temperature={cfg.teacher_temperature} must be > 0")
    if cfg.special_token_weight <= 0:
        errors.append(f"teacher.special_token_weight={cfg.special_token_weight} must be > 0")
    if cfg.teacher == "soft" and task_name != "token_reversal":
        errors.append(f"teacher.teacher='soft' is defined on token_reversal (cyclic distance "
                      f"over its alphabet), not on {task_name!r}: use --teacher oracle or "
                      "--task token_reversal")
    if not 1 <= cfg.overlap_k <= num_actions:
        errors.append(f"teacher.overlap_k={cfg.overlap_k} must lie in [1, {num_actions}] (the "
                      "student's actions)")
    if cfg.teacher_path:
        errors.append(f"teacher.teacher_path={cfg.teacher_path!r}: this method distils from a "
                      "built-in teacher (--teacher oracle|soft); drop --teacher_path")
    return errors


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
