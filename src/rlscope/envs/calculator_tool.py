"""``calculator_tool``: arithmetic word problems with a calculator the policy may call
(issue 20).

Problem. A one-line word problem drawn from the seed (`make_problem`; templates per
``calculator_difficulty``: 1, one sum or difference of numbers in 2..99; 2, a product and a
sum or difference; 3, two products, or a product shared out by an exact division). The initial
observation is the problem and ``Use calc(<expression>) or answer <number>.\\n``.

Turns. Each policy turn is one line (ended by the newline, the turn's stop token):

- ``calc(<expression>)``: the environment evaluates the expression with `evaluate` and answers
  ``= <value>\\n`` (an integer, or ``p/q`` in lowest terms), or ``error: <why>\\n``; reward 0;
- ``answer <integer>`` (``answer: <integer>`` too; ``calc`` and ``answer`` in any case): the
  episode ends, ``solved`` with reward 1
  if it is the problem's answer, else ``failed`` with reward 0;
- anything else (or a turn cut off before its newline): ``write calc(<expression>) or answer
  <number>\\n`` (after a newline when the turn was cut off), reward 0.

Expressions (`evaluate`, never ``eval``): decimal integers, ``+``, ``-`` (or ``−``), ``*``
(or ``×``, ``x``), ``/`` (or ``÷``), unary signs and parentheses, evaluated exactly over the
rationals with the usual precedence. Limits, each an ``error:`` line, in bounded time: at most
``calculator_max_expr_chars`` characters, ``calculator_max_depth`` nested parentheses, and no
number or intermediate result whose numerator or denominator exceeds
``calculator_max_magnitude``; division by zero, ``**``, ``^`` and any other character are errors.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from fractions import Fraction

from rlscope.envs.base import Transition
from rlscope.envs.config import EnvConfig
from rlscope.envs.demos import Segment, play
from rlscope.envs.text import NEWLINE, encode, read_line

HOW_TO = "write calc(<expression>) or answer <number>\n"
_CALL = re.compile(r"calc\((.*)\)", re.IGNORECASE)
_ANSWER = re.compile(r"answer:? *(-?[0-9]{1,18})", re.IGNORECASE)
_TOKEN = re.compile(r"\s*(?:([0-9]+)|(.))")
_SYNONYMS = {"−": "-", "×": "*", "x": "*", "÷": "/"}
NAMES = ("Ann", "Ben", "Carla", "Dev", "Eva", "Femi", "Gus", "Hana")
ITEMS = ("apple", "marble", "pencil", "sticker", "cookie", "card")


class CalcError(ValueError):
    """An expression `evaluate` refuses; the message says why, in a few words."""


@dataclass(frozen=True)
class CalcLimits:
    """What `evaluate` accepts."""

    max_chars: int = 64
    """Longest expression (characters)."""
    max_depth: int = 8
    """Deepest parenthesis nesting."""
    max_magnitude: int = 10**12
    """Largest numerator or denominator of any number or intermediate result."""


class _Parser:
    """Recursive descent over a token list (depth bounded by ``limits.max_depth``)."""

    def __init__(self, tokens: list[str], limits: CalcLimits) -> None:
        self.tokens, self.limits, self.pos = tokens, limits, 0

    def peek(self) -> str:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else ""

    def take(self) -> str:
        token = self.peek()
        self.pos += 1
        return token

    def check(self, value: Fraction) -> Fraction:
        if max(abs(value.numerator), value.denominator) > self.limits.max_magnitude:
            raise CalcError(f"a value is larger than {self.limits.max_magnitude}")
        return value

    def expression(self, depth: int) -> Fraction:
        value = self.term(depth)
        while self.peek() in ("+", "-"):
            op, right = self.take(), self.term(depth)
            value = self.check(value + right if op == "+" else value - right)
        return value

    def term(self, depth: int) -> Fraction:
        value = self.factor(depth)
        while self.peek() in ("*", "/"):
            op = self.take()
            if op == "*" and self.peek() == "*":
                raise CalcError("powers are not supported")
            right = self.factor(depth)
            if op == "/" and right == 0:
                raise CalcError("division by zero")
            value = self.check(value * right if op == "*" else value / right)
        return value

    def factor(self, depth: int) -> Fraction:
        sign = 1
        while self.peek() in ("+", "-"):  # a loop, not recursion: "----5" costs no depth
            sign = -sign if self.take() == "-" else sign
        token = self.take()
        if token.isascii() and token.isdigit():
            if len(token) > len(str(self.limits.max_magnitude)):
                raise CalcError(f"a value is larger than {self.limits.max_magnitude}")
            return self.check(sign * Fraction(int(token)))
        if token == "(":
            if depth >= self.limits.max_depth:
                raise CalcError(f"more than {self.limits.max_depth} nested parentheses")
            value = self.expression(depth + 1)
            if self.take() != ")":
                raise CalcError("missing )")
            return sign * value
        raise CalcError(f"unexpected {token!r}" if token else "incomplete expression")


def evaluate(expression: str, limits: CalcLimits | None = None) -> Fraction:
    """The exact value of ``expression`` (the module docstring's grammar); `CalcError` with a
    short reason for anything else. Time and memory are linear in the (length-capped) input."""
    limits = limits or CalcLimits()
    if len(expression) > limits.max_chars:
        raise CalcError(f"expression longer than {limits.max_chars} characters")
    tokens = []
    for match in _TOKEN.finditer(expression.rstrip()):
        number, other = match.groups()
        tokens.append(number or _SYNONYMS.get(other, other))
    if "^" in tokens:
        raise CalcError("powers are not supported")
    if not tokens:
        raise CalcError("empty expression")
    parser = _Parser(tokens, limits)
    value = parser.expression(0)
    if parser.pos < len(tokens):
        raise CalcError(f"unexpected {tokens[parser.pos]!r}")
    return value


def show(value: Fraction) -> str:
    """``value`` as an integer or ``p/q`` in lowest terms."""
    return str(value.numerator) if value.denominator == 1 else \
        f"{value.numerator}/{value.denominator}"


@dataclass(frozen=True)
class Problem:
    """One word problem: its text, an expression computing the answer, the answer."""

    text: str
    expression: str
    answer: int


def make_problem(rng: random.Random, difficulty: int, max_operand: int = 99) -> Problem:
    """A word problem of level ``difficulty`` (1–3) from ``rng``: the numbers of level 1 and the
    added or removed number of level 2 are drawn from 2..``max_operand``, the factors from
    2..min(19, ``max_operand``) (99, the default, is the original distribution)."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    template = rng.randrange(2)
    big, small = max_operand, min(19, max_operand)
    if difficulty == 1:
        a, b = rng.randint(2, big), rng.randint(2, big)
        if template == 0:
            return Problem(f"{name} has {a} {item}s and gets {b} more. How many {item}s does "
                           f"{name} have now?", f"{a}+{b}", a + b)
        a, b = max(a, b), min(a, b)
        return Problem(f"{name} has {a} {item}s and gives away {b}. How many {item}s are "
                       "left?", f"{a}-{b}", a - b)
    if difficulty == 2:
        a, b, c = rng.randint(2, small), rng.randint(2, small), rng.randint(2, big)
        if template == 0:
            c = min(c, a * b)
            return Problem(f"{name} buys {a} bags of {b} {item}s and gives away {c}. How many "
                           f"{item}s are left?", f"{a}*{b}-{c}", a * b - c)
        return Problem(f"{name} has {c} {item}s and buys {a} bags of {b} more. How many "
                       f"{item}s does {name} have now?", f"{c}+{a}*{b}", c + a * b)
    a, b, c, d = (rng.randint(2, small) for _ in range(4))
    if template == 0:
        return Problem(f"{name} has {a} bags of {b} {item}s and {c} boxes of {d} {item}s. How "
                       f"many {item}s is that in all?", f"{a}*{b}+{c}*{d}", a * b + c * d)
    a = c * rng.randint(1, 9)
    return Problem(f"{name} shares {a} bags of {b} {item}s equally among {c} friends. How many "
                   f"{item}s does each friend get?", f"{a}*{b}/{c}", a * b // c)


@dataclass
class CalculatorEnv:
    """One episode: the word problem and the calculator's limits."""

    problem: Problem
    limits: CalcLimits

    def reset(self) -> tuple[int, ...]:
        """The problem and how to answer it."""
        return encode(f"{self.problem.text} Use calc(<expression>) or answer <number>.\n")

    def step(self, action: tuple[int, ...]) -> Transition:
        """Evaluate a ``calc(...)`` call or judge an ``answer`` (see the module docstring)."""
        text, terminated = read_line(action)
        line = text.strip()
        if not terminated:
            return Transition(encode("\n" + HOW_TO), 0.0, False)
        if call := _CALL.fullmatch(line):
            try:
                reply = f"= {show(evaluate(call.group(1), self.limits))}\n"
            except CalcError as e:
                reply = f"error: {e}\n"
            return Transition(encode(reply), 0.0, False)
        if answer := _ANSWER.fullmatch(line):
            if int(answer.group(1)) == self.problem.answer:
                return Transition((), 1.0, True, "solved")
            return Transition((), 0.0, True, "failed")
        return Transition(encode(HOW_TO), 0.0, False)


class CalculatorTool:
    """Factory of ``calculator_tool`` episodes."""

    name: str = "calculator_tool"
    vocab_size: int = 256
    turn_stop_token_ids: tuple[int, ...] = (NEWLINE,)

    def __init__(self, cfg: EnvConfig) -> None:
        self.cfg = cfg
        self.limits = CalcLimits(cfg.calculator_max_expr_chars, cfg.calculator_max_depth,
                                 cfg.calculator_max_magnitude)

    def validate(self) -> list[str]:
        """Problems with the calculator_tool options, each saying what to change."""
        problems = []
        if not 2 <= self.cfg.calculator_max_operand <= 99:
            problems.append(f"--calculator_max_operand must be in 2..99 "
                            f"(got {self.cfg.calculator_max_operand})")
        if self.cfg.calculator_difficulty not in (1, 2, 3):
            problems.append(f"--calculator_difficulty must be 1, 2 or 3 "
                            f"(got {self.cfg.calculator_difficulty})")
        if not 1 <= self.cfg.calculator_max_expr_chars <= 1000:
            problems.append(f"--calculator_max_expr_chars must be in 1..1000 "
                            f"(got {self.cfg.calculator_max_expr_chars})")
        if not 1 <= self.cfg.calculator_max_depth <= 100:
            problems.append(f"--calculator_max_depth must be in 1..100 "
                            f"(got {self.cfg.calculator_max_depth})")
        if not 1000 <= self.cfg.calculator_max_magnitude <= 10**18:
            problems.append(f"--calculator_max_magnitude must be in 1000..10**18 "
                            f"(got {self.cfg.calculator_max_magnitude})")
        return problems

    def make(self, seed: int) -> CalculatorEnv:
        """The episode whose word problem is drawn from ``seed``."""
        problem = make_problem(random.Random(seed), self.cfg.calculator_difficulty,
                               self.cfg.calculator_max_operand)
        return CalculatorEnv(problem, self.limits)

    def demonstration(self, seed: int, max_turns: int = 64) -> list[Segment]:
        """One ``calc(...)`` of the problem's expression, then ``answer`` with its result."""
        env = self.make(seed)
        lines = [f"calc({env.problem.expression})\n", f"answer {env.problem.answer}\n"]
        return play(env, lambda segments: encode(lines[min(len(segments) // 2, 1)]), max_turns)
