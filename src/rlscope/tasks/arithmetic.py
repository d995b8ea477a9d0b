"""``arithmetic``: integer arithmetic over bytes, with a verifier that never crashes
(TASKS.md, "Real-model tasks").

Prompt. An expression and ``=``, as UTF-8 bytes (`rlscope.tokenizer.ByteTokenizer`, ids
0..255), e.g. ``"17+25="``, left-padded with NUL to the task's ``prompt_len``. Levels
(``difficulty``); operands are uniform integers, operators uniform over the level's set:

==========  =========  ============  ======  ============  ===========  ==============
difficulty  operands   operand range  ops    prompt bytes  answer       completion_len
==========  =========  ============  ======  ============  ===========  ==============
1           2          0..99         ``+``   ≤ 6           0..198       4
2           2          10..999       ``+-``  ≤ 8           −989..1998   5
3           3 or 4     0..99         ``+-``  ≤ 12          −297..396    5
==========  =========  ============  ======  ============  ===========  ==============

The expression is evaluated left to right (only + and −, so this is the usual value).

Completion. Bytes ending with the stop token, a newline (id 10), e.g. ``"42\\n"``;
``completion_len`` = the longest answer (sign included) + 1 for the stop token. A correct
answer is the canonical decimal form of the value: ASCII digits, no leading zeros, ``-`` for a
negative value. Not accepted (the row is malformed): a leading ``+``, spaces, leading zeros,
``-0``, exponents (``1e5``), non-ASCII digits (Arabic-Indic ``٣``, full-width), a lone ``-``,
empty text, more than 18 digits, and any completion without the stop token (unterminated).

Reward. 1 if the text before the stop token is the exact answer; otherwise ``format_reward``
(default 0) if it is well-formed (terminated, canonical integer), else 0. So the reward is 1
exactly on a correct answer and binary when ``format_reward`` = 0. The answer is recomputed
from the prompt bytes; the completion is decoded only to score it (training reads the sampled
ids). Prompts also carry the target bytes (answer + newline, newline-padded) for reference;
the task is not label-trained (``has_labels`` False).

Evaluation (greedy, clean) on ``eval_batches × eval_batch_size`` prompts drawn once per seed
from a generator seeded with ``seed + EVAL_SEED_OFFSET``: ``test_error`` = 1 − exact
accuracy; ``format_error`` = the share of malformed answers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from rlscope.batch import PromptBatch, RolloutBatch
from rlscope.tasks.base import (
    EVAL_OPTIONS,
    NOISE_OPTIONS,
    Scores,
    TaskConfig,
    TaskTraits,
    unused_option_errors,
)
from rlscope.tasks.text import (
    STOP_ID,
    TEXT_OPTIONS,
    completion_ids,
    fixed_left_padded,
    prompt_texts,
    stop_padded,
    text_before_stop,
    text_traits,
)
from rlscope.tokenizer import ByteTokenizer

EVAL_SEED_OFFSET = 1_000_003
MAX_DIGITS = 18
"""Longest well-formed answer (digits): keeps parsing O(1) on any text."""
_CANONICAL = re.compile(rf"0|-?[1-9][0-9]{{0,{MAX_DIGITS - 1}}}")
_EXPRESSION = re.compile(r"([0-9]+)((?:[+-][0-9]+)*)=")


@dataclass(frozen=True)
class Level:
    """One difficulty level: operand count range, operand value range, operator set."""

    min_operands: int
    max_operands: int
    low: int
    high: int
    ops: str

    def answer_bounds(self) -> tuple[int, int]:
        """The smallest and largest value an expression of this level can take."""
        n = self.max_operands
        top = n * self.high
        bottom = self.low - (n - 1) * self.high if "-" in self.ops else self.min_operands * self.low
        return bottom, top

    def prompt_len(self) -> int:
        n = self.max_operands
        return n * len(str(self.high)) + (n - 1) + 1

    def completion_len(self) -> int:
        return max(len(str(v)) for v in self.answer_bounds()) + 1


LEVELS: dict[int, Level] = {
    1: Level(2, 2, 0, 99, "+"),
    2: Level(2, 2, 10, 999, "+-"),
    3: Level(3, 4, 0, 99, "+-"),
}


def parse_answer(text: str) -> int | None:
    """The integer ``text`` spells in canonical decimal form (``0``, ``42``, ``-7``), else None.

    Never raises: anything else (empty, ``+5``, ``" 5"``, ``007``, ``-0``, ``1e5``, ``٣``,
    over 18 digits, partial ``-``) is None."""
    if not isinstance(text, str) or _CANONICAL.fullmatch(text) is None:
        return None
    return int(text)


def evaluate_expression(text: str) -> int | None:
    """The value of an ``a±b±...=`` prompt (ASCII digits, + and −), None if it is not one."""
    match = _EXPRESSION.fullmatch(text)
    if match is None:
        return None
    value = int(match.group(1))
    for sign, number in re.findall(r"([+-])([0-9]+)", match.group(2)):
        value = value + int(number) if sign == "+" else value - int(number)
    return value


class ArithmeticTask:
    """Integer + / − over bytes ("17+25=" → "42\\n"); reward 1 if exactly right."""

    name = "arithmetic"
    family = "sequence"
    options: tuple[str, ...] = ("difficulty", "format_reward", *EVAL_OPTIONS, *NOISE_OPTIONS)
    has_labels = False

    def __init__(self, cfg: TaskConfig) -> None:
        self.cfg = cfg
        self.tokenizer = ByteTokenizer()
        self.vocab_size = self.tokenizer.vocab_size
        self.level = LEVELS.get(cfg.difficulty, LEVELS[1])
        self.prompt_len = self.level.prompt_len()
        self.completion_len = self.level.completion_len()

    @property
    def traits(self) -> TaskTraits:
        """0/1 rewards unless a format term is paid."""
        return text_traits(binary_rewards=self.cfg.format_reward == 0)

    def validate(self) -> list[str]:
        c = self.cfg
        errors = unused_option_errors(c, self.name, (*TEXT_OPTIONS, "length_limit",
                                                     "band_min_words", "band_max_words"))
        if c.difficulty not in LEVELS:
            errors.append(f"task.difficulty={c.difficulty} must be one of "
                          f"{', '.join(map(str, LEVELS))}")
        if not 0 <= c.format_reward < 1:
            errors.append(f"task.format_reward={c.format_reward} must lie in [0, 1) (a correct "
                          "answer earns 1)")
        if c.eval_batches < 1 or c.eval_batch_size < 1:
            errors.append("task.eval_batches and task.eval_batch_size must be >= 1")
        return errors

    def describe(self) -> str:
        lv = self.level
        fmt = f"; {self.cfg.format_reward:g} for a well-formed wrong answer" \
            if self.cfg.format_reward else ""
        return (f"{self.name}: difficulty {self.cfg.difficulty}, {lv.min_operands}–"
                f"{lv.max_operands} operands in {lv.low}..{lv.high} with {' '.join(lv.ops)}; "
                f"reward 1 for the exact answer then a newline{fmt}")

    # ------------------------------------------------------------------ prompts

    def sample_problems(self, generator: torch.Generator, n: int) -> list[tuple[str, int]]:
        """``n`` problems ``(prompt text, answer)`` from ``generator``."""
        lv = self.level
        counts_B = torch.randint(lv.min_operands, lv.max_operands + 1, (n,), generator=generator)
        values_BN = torch.randint(lv.low, lv.high + 1, (n, lv.max_operands), generator=generator)
        ops_BN = torch.randint(0, len(lv.ops), (n, lv.max_operands), generator=generator)
        problems = []
        for count, values, ops in zip(counts_B.tolist(), values_BN.tolist(), ops_BN.tolist(),
                                      strict=True):
            text = str(values[0]) + "".join(lv.ops[o] + str(v) for o, v in
                                            zip(ops[1:count], values[1:count], strict=True))
            answer = evaluate_expression(text + "=")
            assert answer is not None
            problems.append((text + "=", answer))
        return problems

    def _batch(self, problems: list[tuple[str, int]]) -> PromptBatch:
        prompts = fixed_left_padded([self.tokenizer.encode(p) for p, _ in problems],
                                    self.prompt_len)
        answers = [[*self.tokenizer.encode(str(a)), STOP_ID] for _, a in problems]
        score_B = torch.tensor([len(a) for a in answers])
        score_mask_BT = (torch.arange(self.completion_len) < score_B[:, None]).float()
        return PromptBatch(tokens_BP=prompts.tokens_BP, attention_mask_BP=prompts.attention_mask_BP,
                           targets_BT=stop_padded(answers, self.completion_len),
                           score_mask_BT=score_mask_BT)

    def sample_prompts(self, generator: torch.Generator, n: int) -> PromptBatch:
        return self._batch(self.sample_problems(generator, n))

    def eval_prompts(self, seed: int) -> list[PromptBatch]:
        g = torch.Generator().manual_seed(seed + EVAL_SEED_OFFSET)
        return [self.sample_prompts(g, self.cfg.eval_batch_size)
                for _ in range(self.cfg.eval_batches)]

    def sft_pairs(self, generator: torch.Generator, n: int) -> list[tuple[list[int], list[int]]]:
        """``n`` supervised pairs ``(prompt ids, completion ids)``: a fresh problem and its
        exact answer followed by the stop token (for `rlscope sft`)."""
        return [(self.tokenizer.encode(p), [*self.tokenizer.encode(str(a)), STOP_ID])
                for p, a in self.sample_problems(generator, n)]

    # ------------------------------------------------------------------ scoring

    def _judge(self, batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """``(correct_B, well_formed_B)`` float, on the completion's device."""
        correct, formed = [], []
        for prompt, ids in zip(prompt_texts(batch, self.tokenizer), completion_ids(batch),
                               strict=True):
            text, terminated = text_before_stop(ids, self.tokenizer)
            value = parse_answer(text) if terminated else None
            formed.append(value is not None)
            correct.append(value is not None and value == evaluate_expression(prompt))
        device = batch.completion_tokens_BT.device
        return (torch.tensor(correct, dtype=torch.float32, device=device),
                torch.tensor(formed, dtype=torch.float32, device=device))

    def score(self, batch: RolloutBatch) -> Scores:
        """r = 1 on the exact answer, ``format_reward`` on another well-formed one, else 0."""
        correct_B, formed_B = self._judge(batch)
        rewards_B = correct_B + self.cfg.format_reward * formed_B * (1.0 - correct_B)
        return Scores(rewards_B=rewards_B)

    def expected_reward(self, logp_targets_BT: torch.Tensor) -> torch.Tensor | None:
        """Not exposed (the reward is not the probability of one fixed completion)."""
        return None

    def eval_metrics(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        """``test_error`` = 1 − [exact answer]; ``format_error`` = 1 − [well-formed]."""
        correct_B, formed_B = self._judge(batch)
        return {"test_error": 1.0 - correct_B, "format_error": 1.0 - formed_B}
