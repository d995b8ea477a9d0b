"""`EnvConfig`: the options of the registered environments (docs/environments.md).

One flat frozen dataclass, each field prefixed by the environment that reads it, so it can be
parsed by tyro next to the other configs without name clashes. Each environment's factory
checks its own fields (``validate``), with problems saying what to change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class EnvConfig:
    """Options of the multi-turn environments (each reads the fields named after it)."""

    guess_low: int = 1
    """guess_number: smallest possible hidden number."""
    guess_high: int = 100
    """guess_number: largest possible hidden number."""
    guess_turn_penalty: float = 0.1
    """guess_number: finding the number on turn t earns max(0.1, 1 − penalty·(t − 1))."""
    twenty_questions_answerer: Literal["oracle", "model"] = "oracle"
    """twenty_questions: who answers the questions: 'oracle' (rule-based, over the shipped
    table) or 'model' (a frozen rlscope policy warm-started by `rlscope sft` on the table's
    question/answer pairs, read from --twenty_questions_answerer_path)."""
    twenty_questions_answerer_path: str = ""
    """twenty_questions: with --twenty_questions_answerer model, the answerer's weights: the
    output directory of `rlscope sft --task twenty_questions_answerer` (its sft.pt), a run
    directory of `rlscope train --task twenty_questions_answerer` (its latest checkpoint), or
    such a checkpoint file."""
    twenty_questions_train_answerer: bool = False
    """twenty_questions: train the model answerer too (the multi-agent case), after each
    policy update, with its own optimizer, on the faithful-answer reward: 1 when its sampled
    answer to a question the policy asked equals the table's (the oracle's), else 0
    (docs/environments.md)."""
    twenty_questions_answerer_lr: float = 1e-4
    """twenty_questions: Adam learning rate of the answerer's own optimizer
    (--twenty_questions_train_answerer)."""
    twenty_questions_answerer_samples: int = 4
    """twenty_questions: answers the trained answerer samples (temperature 1) per question of
    the batch; its advantage is the reward minus their mean (--twenty_questions_train_answerer)."""
    twenty_questions_turn_penalty: float = 0.0
    """twenty_questions: a correct guess on turn t earns max(0.1, 1 − penalty·(t − 1)); 0 makes
    every correct guess worth 1."""
    calculator_difficulty: int = 1
    """calculator_tool: word-problem level, 1 (one + or −), 2 (a product and a sum or
    difference) or 3 (two products, or a product shared out by exact division)."""
    calculator_max_operand: int = 99
    """calculator_tool: largest number in a word problem, 2..99 (levels 2 and 3 draw their
    factors from 2..min(19, this)); smaller is easier: 9 makes every operand one digit, which
    the tiny model learns to copy (docs/recipes.md). 99 keeps the problems as they were."""
    calculator_max_expr_chars: int = 64
    """calculator_tool: longest expression ``calc(...)`` evaluates (longer: an error line)."""
    calculator_max_depth: int = 8
    """calculator_tool: deepest parenthesis nesting ``calc(...)`` evaluates."""
    calculator_max_magnitude: int = 10**12
    """calculator_tool: largest absolute value (numerator and denominator) of any number or
    intermediate result; beyond it ``calc(...)`` answers an error line."""
    code_repair_cpu_seconds: int = 2
    """code_repair: CPU seconds of one sandboxed run."""
    code_repair_wall_seconds: float = 5.0
    """code_repair: wall-clock seconds of one sandboxed run (code that never terminates is
    killed then and reported)."""
    code_repair_per_test_seconds: float = 1.0
    """code_repair: seconds of one hidden test inside the sandbox."""
    code_repair_feedback_chars: int = 200
    """code_repair: longest feedback (the failing test's report) shown to the policy."""
    code_repair_partial_credit: bool = False
    """code_repair: each turn earns the increase of the best fraction of tests passed so far
    (the episode's return is the best fraction reached); off: 1 only when all tests pass."""
    code_repair_show_expected: bool = True
    """code_repair: the feedback shows the failing test's expected value; off, only its call
    (each failed attempt reveals one hidden test, which a policy with as many turns as tests
    could hard-code)."""
    code_repair_heldout: bool = False
    """code_repair: draw the specifications from the held-out set (evaluation) instead of the
    training set."""
    code_repair_max_reference_chars: int = 0
    """code_repair: keep only the specs whose reference body has at most this many characters
    (an easier family; 50 keeps 10 of the 17 training specs, mostly one-line bodies such as
    ``return s[::-1]``); 0 keeps every spec."""
    code_repair_repair_demos: float = 0.0
    """code_repair: fraction in [0, 1] of the warm start's demonstrations (`rlscope sft`) that
    are repairs: a wrong first body (a mutation of the reference that fails the spec's tests:
    a swapped operator, an off-by-one, a swapped builtin, a wrong return value, a truncated
    body or typos), the sandbox's real feedback on it, then the reference body, which solves it. The
    wrong body is shown but left out of the loss. Which episodes are repairs, and their
    mutation, follow from the episode's seed; needs --max_turns >= 2. 0: every demonstration
    is the reference solving the spec in one turn."""
    code_repair_unsafe_sandbox: bool = False
    """code_repair: run the code in the weak subprocess sandbox instead of the isolated one
    (docs/sandbox.md); only for machines without bubblewrap, never with an adversarial
    policy."""
