"""``code_repair``: the code task (``code_unit_tests``) in several turns: the policy writes a
function body, the sandbox runs it against the hidden tests, the failing test comes back, the
policy revises (issue 20).

Specs. The code task's `rlscope/data/code_specs.json` (signature, docstring, reference body,
hidden tests ``function(*args) == expected``); training specs by default, the held-out ones
with ``code_repair_heldout``; ``code_repair_max_reference_chars`` keeps only the specs whose
reference body is that short (an easier family: mostly one-line bodies). The episode's spec
is drawn from the seed.

Tokens. Byte ids 0..255 plus the code task's END token (`END`, id 256), which ends a policy
turn (the turn's stop token), so a body may span lines. The initial observation is the spec's
prompt, ``def <signature>:`` and the docstring line, exactly as in ``code_unit_tests``.

Turns. The policy's turn is a body, read as the code task reads a completion (`extract_body`:
the text before END, cut before the first non-empty line that is not indented; a body the
per-turn budget cut off before END is run as it is). The program (prompt + body) runs in
`rlscope.sandbox` against the spec's hidden tests, under the ``code_repair_*`` limits. Then:

- every test passes: the episode ends ``solved``, reward 1, no observation;
- otherwise the observation is a feedback comment and the prompt again, so the next turn
  writes a fresh body of the same function::

      # 2/4 tests passed; failed: add(1, 2) should return 3 (wrong answer)
      def add(a, b):
          \"\"\"Return the sum of a and b.\"\"\"

  The comment names the first failing test (its arguments, expected value unless
  ``code_repair_show_expected`` is off, and error: ``wrong answer`` or the exception's name);
  when the program does not run, the sandbox's status and reason (``# timeout: wall-clock
  limit of 5 s``: code that never terminates is killed by the limits and reported). It is one
  line, cut to ``code_repair_feedback_chars`` characters. Each failed attempt so reveals one
  hidden test: a policy with as many turns as tests could hard-code them, so keep the turn
  budget below the test count (3–6 per spec) or turn ``code_repair_show_expected`` off.

Demonstrations (`rlscope sft`). The reference body, solving the spec in one turn; with
``code_repair_repair_demos`` FRAC, that fraction of the episodes (drawn from the seed) is a
repair: a wrong first body (`wrong_bodies`: a mutation of the reference — a swapped operator,
an off-by-one, a swapped builtin, a wrong return value, a truncated body, or typos — that fails
the spec's tests in the sandbox), the environment's feedback on it, then the reference, which
solves it on turn 2. The wrong body is marked `Unlearned`: the warm start sees it but is not
taught to write it. Both kinds are played once (per spec, and per spec and wrong body) and
reused.

Reward. 1 on the turn all tests pass, 0 on the others; with ``code_repair_partial_credit``,
each turn earns the increase of the best fraction of tests passed so far, so the episode's
return is the best fraction it reached (1 when solved). The sampler's turn budget ends an
unsolved episode.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlscope.envs.base import EpisodeBudget, Transition
from rlscope.envs.config import EnvConfig
from rlscope.envs.demos import Segment, Unlearned, play
from rlscope.envs.text import encode, read_line
from rlscope.sandbox import (
    SandboxLimits,
    SandboxResult,
    isolation_problem,
    run_tests,
)
from rlscope.sandbox.isolated import INSTALL_HINT
from rlscope.sandbox.specs import END, CodeSpec, extract_body, load_specs
from rlscope.tokenizer import ByteTokenizer

TOKENIZER = ByteTokenizer([END])
END_ID = TOKENIZER.special_id(END)


def _call(function: str, args: tuple[Any, ...]) -> str:
    return f"{function}({', '.join(repr(a) for a in args)})"


def feedback(spec: CodeSpec, result: SandboxResult, max_chars: int,
             show_expected: bool = True) -> str:
    """The one-line comment (newline included) reporting ``result``: passed count and the first
    failing test (with its expected value when ``show_expected``), or the status and reason
    when the program did not run; the line is cut to ``max_chars`` characters before its
    newline."""
    if result.status == "ok":
        index = next(i for i, o in enumerate(result.outcomes) if not o.passed)
        test = spec.tests[index]
        expected = f" should return {test.expected!r}" if show_expected else ""
        text = (f"# {result.passed}/{result.total} tests passed; failed: "
                f"{_call(spec.function, test.args)}{expected} ({result.outcomes[index].error})")
    else:
        text = f"# {result.status}: {result.reason}"
    return " ".join(text.split())[:max_chars] + "\n"


OPERATOR_SWAPS = ((" + ", " - "), (" - ", " + "), (" * ", " + "), (" // ", " % "),
                  (" % ", " // "), (" == ", " != "), (" != ", " == "), (" <= ", " < "),
                  (" >= ", " > "), (" < ", " > "), (" > ", " < "), (" not in ", " in "),
                  (" in ", " not in "), (" and ", " or "), (" or ", " and "))
"""`wrong_bodies`' operator mutation: the first of these (by position in the body) swapped."""
BUILTIN_SWAPS = {"max": "min", "min": "max", "sum": "len", "len": "sum"}
"""`wrong_bodies`' builtin mutation: the first call of one of these, renamed."""


def _swap_operator(body: str) -> str:
    """``body`` with its first operator of `OPERATOR_SWAPS` swapped (the loop's ``for x in``
    is not an operator)."""
    hits = [(m.start(), -len(old), old, new) for old, new in OPERATOR_SWAPS
            for m in re.finditer(re.escape(old), body)
            if not (old.strip().endswith("in") and re.search(r"\bfor \w+$", body[:m.start()]))]
    if not hits:
        return body
    at, _, old, new = min(hits)
    return body[:at] + new + body[at + len(old):]


def _swap_builtin(body: str) -> str:
    """``body`` with its first call of a `BUILTIN_SWAPS` builtin renamed."""
    return re.sub(r"\b(max|min|sum|len)\(", lambda m: BUILTIN_SWAPS[m.group(1)] + "(", body,
                  count=1)


def _last_return(body: str, expression: str) -> str:
    """``body`` with its last ``return X`` line returning ``expression`` (``{}`` stands for
    X)."""
    lines = body.splitlines(keepends=True)
    for i in reversed(range(len(lines))):
        head, found, tail = lines[i].partition("return ")
        if found and not head.strip():
            lines[i] = head + "return " + expression.format(tail.rstrip("\n")) + "\n"
            break
    return "".join(lines)


def _truncate(body: str) -> str:
    """The first half of a body's lines, or of a one-line body's words (rounded up)."""
    lines = body.splitlines(keepends=True)
    if len(lines) > 1:
        return "".join(lines[:(len(lines) + 1) // 2])
    indent = body[:len(body) - len(body.lstrip())]
    words = body.split()
    return indent + " ".join(words[:(len(words) + 1) // 2]) + "\n"


TYPO_BODIES = 20
"""`wrong_bodies`' typo'd references per spec (besides the 3–5 structural mutations)."""


def _typos(body: str, rng: random.Random) -> str:
    """``body`` with 1–3 typos (a character deleted, doubled, replaced by another of the body,
    or swapped with the next), never in the indentation or on a newline."""
    chars = list(body)
    for _ in range(rng.randint(1, 3)):
        text = "".join(chars)
        spots = [k for k in range(len(text))  # past the indentation, not a newline
                 if text[k] != "\n" and text[text.rfind("\n", 0, k) + 1:k + 1].strip()]
        if not spots:
            break
        k = rng.choice(spots)
        edit = rng.randrange(4)
        if edit == 0:
            del chars[k]
        elif edit == 1:
            chars.insert(k, chars[k])
        elif edit == 2:
            chars[k] = rng.choice([c for c in text if c != "\n"])
        elif k + 1 < len(chars) and chars[k + 1] != "\n":
            chars[k], chars[k + 1] = chars[k + 1], chars[k]
    return "".join(chars)


def wrong_bodies(spec: CodeSpec, typos: int = TYPO_BODIES) -> tuple[str, ...]:
    """Plausible wrong versions of ``spec``'s reference body, in a fixed order, each different
    from the reference and from the others: the first operator swapped (``+``/``-``,
    ``==``/``!=``, ``%``/``//``, ``in``/``not in``, ...), the returned value off by one
    (``return X + 1``), the first ``max``/``min``/``sum``/``len`` call swapped, the first
    parameter returned instead, the body truncated to its first half; then ``typos`` copies of
    the reference with 1–3 typos each (drawn from the spec's name: the garbled bodies a
    half-trained policy writes). Whether each really fails the tests is for the sandbox to say
    (`CodeRepair.repair` skips those that pass)."""
    first = re.search(r"\((\w+)", spec.prompt)
    candidates = [_swap_operator(spec.reference), _last_return(spec.reference, "{} + 1"),
                  _swap_builtin(spec.reference),
                  _last_return(spec.reference, first.group(1)) if first else spec.reference,
                  _truncate(spec.reference)]
    out: list[str] = []
    for body in candidates:
        if body != spec.reference and body not in out:
            out.append(body)
    rng = random.Random(spec.function)
    structural = len(out)
    for _ in range(50 * typos):
        if len(out) == structural + typos:
            break
        body = _typos(spec.reference, rng)
        if body != spec.reference and body not in out:
            out.append(body)
    return tuple(out)


def _scripted(*actions: tuple[int, ...]) -> Callable[[list[Segment]], tuple[int, ...]]:
    """A player (for `play`) writing ``actions`` in order, one a turn."""
    return lambda segments: actions[sum(is_policy for _, is_policy in segments)]


@dataclass
class CodeRepairEnv:
    """One episode: the spec, the sandbox settings and the best fraction passed so far."""

    spec: CodeSpec
    limits: SandboxLimits
    unsafe: bool
    feedback_chars: int
    partial_credit: bool
    show_expected: bool = True
    best: float = 0.0

    def reset(self) -> tuple[int, ...]:
        """The spec's prompt."""
        self.best = 0.0
        return encode(self.spec.prompt)

    def step(self, action: tuple[int, ...]) -> Transition:
        """Run the body in the sandbox and answer (see the module docstring)."""
        text, _ = read_line(action, TOKENIZER, END_ID)
        result = run_tests(self.spec.prompt + extract_body(text), self.spec.function,
                           self.spec.tests, self.limits, unsafe=self.unsafe)
        gain = max(0.0, result.reward - self.best)  # reward: 0 unless the program ran
        self.best = max(self.best, result.reward)
        solved = result.status == "ok" and result.passed == result.total
        reward = gain if self.partial_credit else float(solved)
        if solved:
            return Transition((), reward, True, "solved")
        separator = "" if not text or text.endswith("\n") else "\n"
        return Transition(encode(separator + feedback(self.spec, result, self.feedback_chars,
                                                      self.show_expected)
                                 + self.spec.prompt), reward, False)


class CodeRepair:
    """Factory of ``code_repair`` episodes."""

    name: str = "code_repair"
    vocab_size: int = TOKENIZER.vocab_size
    turn_stop_token_ids: tuple[int, ...] = (END_ID,)

    def __init__(self, cfg: EnvConfig, specs: tuple[CodeSpec, ...] | None = None) -> None:
        """``specs``: default the shipped ones (tests may pass their own)."""
        self.cfg = cfg
        longest = cfg.code_repair_max_reference_chars
        self.specs = tuple(s for s in (load_specs() if specs is None else specs)
                           if s.heldout == cfg.code_repair_heldout
                           and (longest <= 0 or len(s.reference) <= longest))
        self.limits = SandboxLimits(cpu_seconds=cfg.code_repair_cpu_seconds,
                                    wall_seconds=cfg.code_repair_wall_seconds,
                                    per_test_seconds=cfg.code_repair_per_test_seconds)
        self._demos: dict[tuple[int, int], list[Segment]] = {}
        self._wrong_bodies: dict[int, tuple[str, ...]] = {}
        self._repairs: dict[tuple[int, int, int], list[Segment] | None] = {}

    def validate(self) -> list[str]:
        """Problems with the code_repair options, each saying what to change."""
        problems = [f"code_repair: {p} (set --code_repair_cpu_seconds, "
                    f"--code_repair_wall_seconds, --code_repair_per_test_seconds > 0)"
                    for p in self.limits.validate()]
        if self.cfg.code_repair_feedback_chars < 20:
            problems.append(f"--code_repair_feedback_chars must be >= 20 "
                            f"(got {self.cfg.code_repair_feedback_chars})")
        if self.cfg.code_repair_max_reference_chars < 0:
            problems.append(f"--code_repair_max_reference_chars must be >= 0 "
                            f"(got {self.cfg.code_repair_max_reference_chars})")
        elif not self.specs:
            problems.append("code_repair has no specs in the chosen split "
                            f"(--code_repair_heldout={self.cfg.code_repair_heldout}, "
                            f"--code_repair_max_reference_chars="
                            f"{self.cfg.code_repair_max_reference_chars}): raise "
                            "--code_repair_max_reference_chars or set it to 0")
        if not 0.0 <= self.cfg.code_repair_repair_demos <= 1.0:
            problems.append(f"--code_repair_repair_demos must lie in [0, 1] (a fraction of the "
                            f"demonstrations; got {self.cfg.code_repair_repair_demos})")
        if not self.cfg.code_repair_unsafe_sandbox and (problem := isolation_problem()):
            problems.append(f"code_repair refuses to run generated code without the isolated "
                            f"sandbox ({problem}): {INSTALL_HINT}")
        return problems

    def budget_problems(self, budget: EpisodeBudget) -> list[str]:
        """A repair demonstration takes two turns: refused with ``--max_turns`` < 2."""
        if self.cfg.code_repair_repair_demos > 0 and budget.max_turns < 2:
            return [f"--code_repair_repair_demos {self.cfg.code_repair_repair_demos} needs "
                    f"--max_turns >= 2 (got {budget.max_turns}): a repair demonstration is a "
                    "wrong body, its feedback and the reference; raise --max_turns or set "
                    "--code_repair_repair_demos 0"]
        return []

    def make(self, seed: int) -> CodeRepairEnv:
        """The episode whose spec is drawn from ``seed``."""
        spec = self.specs[random.Random(seed).randrange(len(self.specs))]
        return CodeRepairEnv(spec, self.limits, self.cfg.code_repair_unsafe_sandbox,
                             self.cfg.code_repair_feedback_chars,
                             self.cfg.code_repair_partial_credit,
                             self.cfg.code_repair_show_expected)

    def demonstration(self, seed: int, max_turns: int = 64) -> list[Segment]:
        """The reference body and END (one turn) or, for the ``code_repair_repair_demos``
        fraction of seeds (with ``max_turns`` >= 2), a repair (`repair`): a wrong body of the
        spec drawn from the seed (the next one where the drawn one passes the tests), the
        sandbox's feedback and the reference. The episode depends on the seed only through its spec
        (and its wrong body), so each is played once and then reused: `rlscope sft` draws a
        fresh seed per pair, and a sandbox run per pair dominated its steps."""
        rng = random.Random(seed)
        index = rng.randrange(len(self.specs))  # the spec `make` draws
        if max_turns >= 2 and rng.random() < self.cfg.code_repair_repair_demos:
            n = len(self._wrong(index))
            first = rng.randrange(n) if n else 0
            for k in range(n):
                if (segments := self.repair(index, (first + k) % n, max_turns)) is not None:
                    return segments
        if (index, max_turns) not in self._demos:
            env = self.make(seed)
            body = (*encode(env.spec.reference), END_ID)
            self._demos[index, max_turns] = play(env, lambda segments: body, max_turns)
        return list(self._demos[index, max_turns])

    def _wrong(self, index: int) -> tuple[str, ...]:
        if index not in self._wrong_bodies:
            self._wrong_bodies[index] = wrong_bodies(self.specs[index])
        return self._wrong_bodies[index]

    def repair(self, index: int, wrong: int, max_turns: int = 64) -> list[Segment] | None:
        """The repair demonstration of spec ``index`` (of ``specs``) from its wrong body
        ``wrong`` (of `wrong_bodies`): that body (`Unlearned`), the environment's feedback on
        it and the reference, which solves it; None when the wrong body passes the tests after
        all. Played once (two sandbox runs), then reused."""
        key = (index, wrong, max_turns)
        if key not in self._repairs:
            spec = self.specs[index]
            attempt = Unlearned((*encode(self._wrong(index)[wrong]), END_ID))
            env = CodeRepairEnv(spec, self.limits, self.cfg.code_repair_unsafe_sandbox,
                                self.cfg.code_repair_feedback_chars,
                                self.cfg.code_repair_partial_credit,
                                self.cfg.code_repair_show_expected)
            played = play(env, _scripted(attempt, (*encode(spec.reference), END_ID)),
                          max_turns)
            # the wrong body failed: its feedback, then the reference
            self._repairs[key] = played if len(played) > 2 else None
        segments = self._repairs[key]
        return None if segments is None else list(segments)
