"""The registered multi-turn environments (issue 20, docs/environments.md): transitions and
rewards on hand-written episodes, malformed actions of every kind (an explanatory observation,
never an exception), determinism by seed, pickling, demonstrations and config validation.

The code_repair episode runs the real sandbox (isolated where available, else the weak one:
the code here is ours) four times; its reward and feedback rules are also checked against
planted sandbox results, which costs no process."""

from __future__ import annotations

import dataclasses
import pickle
import random
import re
import time
from typing import Any

import pytest

from rlscope.envs import DONE_REASONS, Environment, EnvironmentFactory, Transition
from rlscope.envs.calculator_tool import (
    HOW_TO,
    CalcError,
    CalcLimits,
    CalculatorEnv,
    CalculatorTool,
    Problem,
    evaluate,
    show,
)
from rlscope.envs.code_repair import (
    END_ID,
    TOKENIZER,
    CodeRepair,
    CodeRepairEnv,
    extract_body,
    feedback,
    load_specs,
    wrong_bodies,
)
from rlscope.envs.config import EnvConfig
from rlscope.envs.demos import Demonstrator, Unlearned
from rlscope.envs.guess_number import GuessNumber, GuessNumberEnv
from rlscope.envs.registry import ENVIRONMENTS, RegisteredEnvironment, make_factory
from rlscope.envs.text import NEWLINE, encode
from rlscope.envs.twenty_questions import (
    CANNOT_ANSWER,
    INTRO,
    NEED_QUESTION,
    OracleAnswerer,
    TwentyQuestions,
    TwentyQuestionsEnv,
    answerer_prompt,
    answerer_sft_pairs,
    clean_answer,
    load_table,
    normalise,
)
from rlscope.sandbox import (
    SandboxLimits,
    SandboxResult,
    TestOutcome,
    isolation_problem,
    run_tests,
)

UNSAFE = bool(isolation_problem())
"""Run code_repair's sandbox in the weak mode where the isolated one is unavailable (the code
these tests run is ours)."""
FAST_CODE = EnvConfig(code_repair_cpu_seconds=1, code_repair_wall_seconds=1.5,
                      code_repair_per_test_seconds=0.5, code_repair_unsafe_sandbox=UNSAFE)


def say(env: Environment, *lines: str) -> list[Transition]:
    """Step ``env`` with each line as one policy turn (its bytes as given)."""
    return [env.step(encode(line)) for line in lines]


def text(tokens: tuple[int, ...]) -> str:
    return TOKENIZER.decode(tokens)


# ---------------------------------------------------------------- registry and protocol


def test_registry_names_and_protocols() -> None:
    assert list(ENVIRONMENTS) == ["guess_number", "twenty_questions", "calculator_tool",
                                  "code_repair"]
    for name, build in ENVIRONMENTS.items():
        factory = build(EnvConfig(code_repair_unsafe_sandbox=UNSAFE))
        assert factory.name == name
        assert isinstance(factory, EnvironmentFactory)
        assert isinstance(factory, RegisteredEnvironment)
        assert isinstance(factory, Demonstrator)
        assert factory.validate() == []
        assert isinstance(factory.make(0), Environment)
    assert ENVIRONMENTS["code_repair"](EnvConfig()).turn_stop_token_ids == (256,)
    assert ENVIRONMENTS["code_repair"](EnvConfig()).vocab_size == 257
    for name in ("guess_number", "twenty_questions", "calculator_tool"):
        factory = ENVIRONMENTS[name](EnvConfig())
        assert (factory.turn_stop_token_ids, factory.vocab_size) == ((NEWLINE,), 256)


def test_make_factory_refuses_unknown_names_and_bad_options() -> None:
    with pytest.raises(ValueError, match="unknown environment 'tic_tac_toe'; choose one of "
                                         "guess_number, twenty_questions"):
        make_factory("tic_tac_toe", EnvConfig())
    with pytest.raises(ValueError, match=r"guess_number: --guess_low \(9\) must be <= "
                                         r"--guess_high \(3\)"):
        make_factory("guess_number", EnvConfig(guess_low=9, guess_high=3))
    assert isinstance(make_factory("calculator_tool", EnvConfig()), CalculatorTool)


def test_config_validation_messages() -> None:
    def problems(name: str, **kw: Any) -> list[str]:
        return ENVIRONMENTS[name](dataclasses.replace(EnvConfig(), **kw)).validate()

    assert problems("guess_number", guess_turn_penalty=1.5) == [
        "--guess_turn_penalty must be in [0, 1] (got 1.5)"]
    assert problems("guess_number", guess_high=10**18) == [
        "--guess_low and --guess_high must have at most 18 digits"]
    assert problems("twenty_questions", twenty_questions_answerer="model") == [
        "--twenty_questions_answerer model needs --twenty_questions_answerer_path DIR (the "
        "output of rlscope sft --task twenty_questions_answerer), or use "
        "--twenty_questions_answerer oracle"]
    assert problems("twenty_questions", twenty_questions_answerer="human") == [
        "--twenty_questions_answerer must be 'oracle' or 'model' (got 'human')"]
    assert problems("twenty_questions", twenty_questions_turn_penalty=-0.1) == [
        "--twenty_questions_turn_penalty must be in [0, 1] (got -0.1)"]
    assert problems("calculator_tool", calculator_difficulty=4) == [
        "--calculator_difficulty must be 1, 2 or 3 (got 4)"]
    assert problems("calculator_tool", calculator_max_operand=1) == [
        "--calculator_max_operand must be in 2..99 (got 1)"]
    assert problems("calculator_tool", calculator_max_depth=0, calculator_max_expr_chars=5000,
                    calculator_max_magnitude=10) == [
        "--calculator_max_expr_chars must be in 1..1000 (got 5000)",
        "--calculator_max_depth must be in 1..100 (got 0)",
        "--calculator_max_magnitude must be in 1000..10**18 (got 10)"]
    assert problems("code_repair", code_repair_unsafe_sandbox=UNSAFE,
                    code_repair_wall_seconds=0.0, code_repair_feedback_chars=5) == [
        "code_repair: sandbox limit wall_seconds=0.0 must be > 0 (set "
        "--code_repair_cpu_seconds, --code_repair_wall_seconds, "
        "--code_repair_per_test_seconds > 0)",
        "--code_repair_feedback_chars must be >= 20 (got 5)"]
    assert problems("code_repair", code_repair_unsafe_sandbox=UNSAFE,
                    code_repair_max_reference_chars=-1) == [
        "--code_repair_max_reference_chars must be >= 0 (got -1)"]
    assert problems("code_repair", code_repair_unsafe_sandbox=UNSAFE,
                    code_repair_max_reference_chars=5) == [
        "code_repair has no specs in the chosen split (--code_repair_heldout=False, "
        "--code_repair_max_reference_chars=5): raise --code_repair_max_reference_chars or set "
        "it to 0"]
    short = CodeRepair(EnvConfig(code_repair_max_reference_chars=50))
    assert [s.function for s in short.specs] == [
        "add", "is_palindrome", "maximum", "reverse_string", "count_vowels", "sum_list",
        "count_words", "gcd", "digit_sum", "clamp"]
    assert all(len(s.reference) <= 50 for s in short.specs)
    assert len(CodeRepair(EnvConfig()).specs) == 17


@pytest.mark.parametrize("name", list(ENVIRONMENTS))
def test_deterministic_by_seed_and_picklable(name: str) -> None:
    factory = ENVIRONMENTS[name](EnvConfig(code_repair_unsafe_sandbox=UNSAFE))
    first = [factory.make(seed).reset() for seed in range(40)]
    assert first == [factory.make(seed).reset() for seed in range(40)]
    hidden = {repr(vars(factory.make(seed))) for seed in range(40)}
    assert len(hidden) >= 5  # the seed changes the hidden state
    env = factory.make(7)
    env.reset()
    if name != "code_repair":  # a code_repair step runs the sandbox (tested below)
        env.step(encode("is it alive?\n" if name == "twenty_questions" else "50\n"))
    clone = pickle.loads(pickle.dumps(env))
    assert vars(clone) == vars(env)
    assert pickle.loads(pickle.dumps(factory)).make(7).reset() == factory.make(7).reset()


@pytest.mark.parametrize("name", ["guess_number", "twenty_questions", "calculator_tool"])
def test_line_environments_never_raise_on_random_tokens(name: str) -> None:
    """Random token ids (invalid UTF-8, NUL, any length, with or without the newline) always
    give a Transition with a valid reason, and an answer after every unfinished turn."""
    rng = random.Random(0)
    factory = ENVIRONMENTS[name](EnvConfig())
    for seed in range(30):
        env = factory.make(seed)
        env.reset()
        for _ in range(6):
            action = tuple(rng.randrange(256) for _ in range(rng.randrange(0, 30)))
            if rng.random() < 0.5:
                action = (*action, NEWLINE)
            out = env.step(action)
            assert isinstance(out, Transition)
            assert out.reward == 0.0 or out.done
            assert out.reason in ("", *DONE_REASONS)
            if out.done:
                break
            assert out.observation and out.observation[-1] == NEWLINE


# ---------------------------------------------------------------- guess_number


def test_guess_number_episode_rewards_and_answers() -> None:
    env = GuessNumberEnv(low=1, high=100, secret=37, turn_penalty=0.1)
    assert text(env.reset()) == "I am thinking of a number from 1 to 100. Guess it.\n"
    lower, higher, found = say(env, "50\n", " 25 \n", "37\n")
    assert lower == Transition(encode("lower\n"), 0.0, False)
    assert higher == Transition(encode("higher\n"), 0.0, False)
    assert found.observation == () and found.done and found.reason == "solved"
    assert found.reward == pytest.approx(0.8)  # 1 − 0.1·(3 − 1)


@pytest.mark.parametrize("line", ["\n", "abc\n", "101\n", "0\n", "-5\n", "4 2\n", "1e2\n",
                                  "٣\n", "37.0\n", "9" * 40 + "\n"])
def test_guess_number_malformed_guesses_get_the_rules(line: str) -> None:
    env = GuessNumberEnv(low=1, high=100, secret=37, turn_penalty=0.1)
    env.reset()
    assert say(env, line) == [Transition(encode("say a number from 1 to 100\n"), 0.0, False)]


def test_guess_number_cut_off_turn_and_late_find() -> None:
    env = GuessNumberEnv(low=1, high=100, secret=37, turn_penalty=0.1)
    env.reset()
    assert env.step(encode("37")) == Transition(encode("\nsay a number from 1 to 100\n"), 0.0,
                                                False)  # no newline: cut off, not judged
    say(env, *["1\n"] * 15)
    assert env.step(encode("37\n")).reward == pytest.approx(0.1)  # the floor, turn 17


def test_guess_number_secret_covers_the_range_and_demo_is_binary_search() -> None:
    factory = GuessNumber(EnvConfig(guess_low=-3, guess_high=4))
    assert {factory.make(seed).secret for seed in range(200)} == set(range(-3, 5))
    factory = GuessNumber(EnvConfig())
    for seed in range(100):
        segments = factory.demonstration(seed)
        policy_turns = sum(is_policy for _, is_policy in segments)
        assert policy_turns <= 7  # ⌈log2(101)⌉
        last = int(text(segments[-1][0]))
        assert segments[-1][1] and last == factory.make(seed).secret


# ---------------------------------------------------------------- twenty_questions


def test_twenty_questions_table_is_consistent_and_distinguishing() -> None:
    table = load_table()
    assert 30 <= len(table.names) <= 60 and 15 <= len(table.attributes) <= 30
    assert all(yes <= set(table.attributes) for yes in table.yes)
    assert len(set(table.yes)) == len(table.names)  # every object distinguishable
    names = [n for name, aliases in zip(table.names, table.aliases, strict=True)
             for n in (name, *aliases)]
    assert len(set(names)) == len(names)
    phrasings = [p for ps in table.phrasings for p in ps]
    assert len(set(phrasings)) == len(phrasings)
    assert all(p == normalise(p) for p in phrasings)
    assert all(table.guessed(p) is None for p in phrasings)  # no question is also a guess
    for attribute in table.attributes:  # every attribute is yes for some, no for others
        assert 0 < sum(attribute in yes for yes in table.yes) < len(table.names)


def _penguin_env(penalty: float = 0.0) -> TwentyQuestionsEnv:
    table = load_table()
    return TwentyQuestionsEnv(table, table.names.index("penguin"), OracleAnswerer(table),
                              penalty)


def test_twenty_questions_oracle_episode() -> None:
    env = _penguin_env()
    assert text(env.reset()) == INTRO
    answers = say(env, "is it an animal?\n", "Can it  FLY ?\n", "is it a dog?\n",
                  "what is it?\n", "is it big\n", "is it alive")
    assert [text(a.observation) for a in answers] == [
        "yes\n", "no\n", "no\n", CANNOT_ANSWER, NEED_QUESTION, "\n" + NEED_QUESTION]
    assert all(a.reward == 0.0 and not a.done for a in answers)
    assert say(env, "is it the penguin?\n") == [Transition((), 1.0, True, "solved")]


def test_twenty_questions_give_up_and_turn_penalty() -> None:
    assert say(_penguin_env(), "I give up\n") == [Transition((), 0.0, True, "gave_up")]
    env = _penguin_env(penalty=0.25)
    solved = say(env, "is it a bird?\n", "no question\n", "is it a penguin?\n")[-1]
    assert solved.done and solved.reward == pytest.approx(0.5)  # 1 − 0.25·(3 − 1)


@dataclasses.dataclass
class StubbornAnswerer:
    """A stand-in for the model answerer: always answers the same line, records its calls."""

    reply: str
    calls: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    def answer(self, secret: str, question: tuple[int, ...]) -> tuple[int, ...]:
        self.calls.append((secret, text(question)))
        return encode(self.reply)


def test_twenty_questions_model_answerer_plugs_in_and_guesses_stay_judged() -> None:
    answerer = StubbornAnswerer("maybe so\nand a second line that is dropped\n")
    factory = TwentyQuestions(EnvConfig(twenty_questions_answerer="model"), answerer=answerer)
    assert factory.validate() == []
    env = factory.make(3)
    env.reset()
    secret = load_table().names[env.secret]
    asked = say(env, "is it alive?\n", f"is it a {secret}?\n")
    assert text(asked[0].observation) == "maybe so\n"
    assert asked[1] == Transition((), 1.0, True, "solved")  # judged by the environment
    assert answerer.calls == [(secret, "is it alive?\n")]
    assert text(clean_answer(encode("y" * 100))) == "y" * 47 + "\n"
    assert text(clean_answer(())) == "\n"


def test_twenty_questions_answerer_sft_pairs_agree_with_the_oracle() -> None:
    table = load_table()
    pairs = answerer_sft_pairs(table)
    n_questions = sum(len(p) for p in table.phrasings) + len(table.names) + 5
    assert len(pairs) == len(table.names) * n_questions
    decoded = {text(tuple(p)): text(tuple(a)) for p, a in pairs}
    assert decoded[answerer_prompt("penguin", "is it a bird?")] == "yes\n"
    assert decoded[answerer_prompt("penguin", "can it fly?")] == "no\n"
    assert decoded[answerer_prompt("sun", "is it a sun?")] == "yes\n"
    assert decoded[answerer_prompt("sun", "is it a dog?")] == "no\n"
    assert decoded[answerer_prompt("sun", "what is it?")] == CANNOT_ANSWER
    assert set(decoded.values()) == {"yes\n", "no\n", CANNOT_ANSWER}


def test_twenty_questions_demonstrations_solve_every_object() -> None:
    factory = TwentyQuestions(EnvConfig())
    table = factory.table
    solved = set()
    for seed in range(300):
        segments = factory.demonstration(seed)
        assert sum(is_policy for _, is_policy in segments) <= 9
        final = factory.make(seed)
        final.reset()
        assert final.step(segments[-1][0]).reason == "solved"
        solved.add(final.secret)
    assert len(solved) == len(table.names)  # 300 seeds draw every object


# ---------------------------------------------------------------- calculator_tool


@pytest.mark.parametrize(("expression", "value"), [
    ("1+2*3", "7"), ("(1+2)*3", "9"), ("7/2", "7/2"), ("6/4*2", "3"), ("-(-3)", "3"),
    ("--5", "5"), ("10 - 2 - 3", "5"), ("2 × (3 − 1) ÷ 4", "1"), ("3x4", "12"),
    ("((((((((1))))))))", "1"), ("999999*1000000", "999999000000"),
])
def test_calculator_evaluates_exactly(expression: str, value: str) -> None:
    assert show(evaluate(expression)) == value


@pytest.mark.parametrize(("expression", "reason"), [
    ("1/0", "division by zero"), ("5/(3-3)", "division by zero"),
    ("2**3", "powers are not supported"), ("9**9**9**9", "powers are not supported"),
    ("2^1000", "powers are not supported"),
    ("(" * 9 + "1" + ")" * 9, "more than 8 nested parentheses"),
    ("(" * 5000 + "1" + ")" * 5000, "expression longer than 64 characters"),
    ("9" * 10_000, "expression longer than 64 characters"),
    ("9" * 13, "a value is larger than 1000000000000"),
    ("999999*999999*999999", "a value is larger than 1000000000000"),
    ("1/9999999/9999999", "a value is larger than 1000000000000"),
    ("", "empty expression"), ("1+", "incomplete expression"), ("(1", "missing )"),
    ("1)", "unexpected ')'"), ("1 2", "unexpected '2'"), ("__import__('os')", "unexpected '_'"),
    ("²", "unexpected '²'"), ("1.5", "unexpected '.'"),
])
def test_calculator_refuses_hostile_expressions_quickly(expression: str, reason: str) -> None:
    start = time.monotonic()
    with pytest.raises(CalcError) as error:
        evaluate(expression)
    assert str(error.value) == reason
    assert time.monotonic() - start < 0.5


def test_calculator_limits_are_the_options() -> None:
    limits = CalcLimits(max_chars=5, max_depth=1, max_magnitude=1000)
    assert show(evaluate("(999)", limits)) == "999"
    with pytest.raises(CalcError, match="more than 1 nested"):
        evaluate("((1))", limits)
    with pytest.raises(CalcError, match="larger than 1000"):
        evaluate("999+2", limits)
    with pytest.raises(CalcError, match="longer than 5"):
        evaluate("1+2+3+4", limits)


def test_calculator_episode() -> None:
    problem = Problem("Ann has 3 bags of 4 apples and 1 more.", "3*4+1", 13)
    env = CalculatorEnv(problem, CalcLimits())
    assert text(env.reset()) == ("Ann has 3 bags of 4 apples and 1 more. Use calc(<expression>) "
                                 "or answer <number>.\n")
    replies = say(env, "calc(3*4+1)\n", " CALC( 3 * 4 ) \n", "calc(1/0)\n", "calc(2**100)\n",
                  "calc(" + "9" * 10_000 + ")\n", "calc(import os)\n", "calc 3+4\n", "13\n",
                  "answer thirteen\n", "answer 13")
    assert [text(r.observation) for r in replies] == [
        "= 13\n", "= 12\n", "error: division by zero\n", "error: powers are not supported\n",
        "error: expression longer than 64 characters\n", "error: unexpected 'i'\n",
        HOW_TO, HOW_TO, HOW_TO, "\n" + HOW_TO]
    assert all(r.reward == 0.0 and not r.done for r in replies)
    assert say(env, "Answer: 13\n") == [Transition((), 1.0, True, "solved")]
    assert say(CalculatorEnv(problem, CalcLimits()), "answer 12\n") == [
        Transition((), 0.0, True, "failed")]


@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_calculator_problems_are_consistent_and_demos_solve_them(difficulty: int) -> None:
    factory = CalculatorTool(EnvConfig(calculator_difficulty=difficulty))
    texts = set()
    for seed in range(60):
        problem = factory.make(seed).problem
        assert evaluate(problem.expression) == problem.answer >= 0
        assert "\n" not in problem.text
        texts.add(problem.text)
        segments = factory.demonstration(seed)
        assert [is_policy for _, is_policy in segments] == [False, True, False, True]
        assert text(segments[2][0]) == f"= {problem.answer}\n"
    assert len(texts) >= 50


def test_calculator_max_operand_bounds_the_numbers_and_keeps_the_default_problems() -> None:
    default, explicit = CalculatorTool(EnvConfig()), CalculatorTool(
        EnvConfig(calculator_max_operand=99))
    assert [default.make(s).problem for s in range(40)] == \
        [explicit.make(s).problem for s in range(40)]
    assert max(max(map(int, re.findall(r"[0-9]+", default.make(s).problem.expression)))
               for s in range(40)) > 9
    for difficulty in (1, 2, 3):
        small = CalculatorTool(EnvConfig(calculator_difficulty=difficulty,
                                         calculator_max_operand=9))
        for seed in range(40):
            problem = small.make(seed).problem
            numbers = [int(n) for n in re.findall(r"[0-9]+", problem.expression)]
            assert evaluate(problem.expression) == problem.answer >= 0
            # level 3's shared-out count is c·k, k ≤ 9, as at the default
            assert all(2 <= n <= 9 for n in numbers[1 if difficulty == 3 and "/" in
                                                    problem.expression else 0:])


# ---------------------------------------------------------------- code_repair


def test_code_repair_specs_and_body_rule_are_the_code_tasks() -> None:
    """Both read the shared specs and body rule (`rlscope.sandbox.specs`), not copies."""
    from rlscope.tasks import code as code_task

    assert load_specs is code_task.load_specs and extract_body is code_task.extract_body
    specs = load_specs()
    assert len(specs) == 22 and all(s.prompt.startswith("def ") for s in specs)
    assert extract_body("    x = 1\n\n    return x\nprint(2)\n") == "    x = 1\n\n    return x\n"
    assert extract_body("    return 2<|end|>junk") == "    return 2"


def _add_env(partial_credit: bool = False) -> CodeRepairEnv:
    cfg = dataclasses.replace(FAST_CODE, code_repair_partial_credit=partial_credit)
    spec = next(s for s in load_specs() if s.function == "add")
    return CodeRepair(cfg, specs=(spec,)).make(0)


def _result(passed: list[bool], status: str = "ok", reason: str = "") -> SandboxResult:
    return SandboxResult(status, sum(passed) if status == "ok" else 0, len(passed),  # type: ignore[arg-type]
                         tuple(TestOutcome(p, "" if p else "wrong answer") for p in passed),
                         reason)


def test_code_repair_feedback_lines() -> None:
    spec = next(s for s in load_specs() if s.function == "add")
    assert feedback(spec, _result([True, False, True, False]), 200) == (
        "# 2/4 tests passed; failed: add(0, 0) should return 0 (wrong answer)\n")
    assert feedback(spec, _result([False, True, True, True]), 200, show_expected=False) == (
        "# 3/4 tests passed; failed: add(1, 2) (wrong answer)\n")
    assert feedback(spec, _result([False] * 4, "timeout", "wall-clock limit of 5 s"),
                    200) == "# timeout: wall-clock limit of 5 s\n"
    assert feedback(spec, _result([False] * 4, "crashed", "SyntaxError: bad\n  line 2"),
                    30) == "# crashed: SyntaxError: bad li\n"  # one line, cut to 30


@pytest.mark.parametrize(("partial", "rewards"), [(False, [0.0, 0.0, 1.0]),
                                                  (True, [0.5, 0.0, 0.5])])
def test_code_repair_rewards_with_planted_results(monkeypatch: pytest.MonkeyPatch,
                                                  partial: bool, rewards: list[float]) -> None:
    """Planted sandbox results: 2/4 passed, then 1/4 (worse: no gain), then 4/4."""
    planted = iter([_result([True, True, False, False]), _result([True, False, False, False]),
                    _result([True] * 4)])
    monkeypatch.setattr("rlscope.envs.code_repair.run_tests", lambda *a, **k: next(planted))
    env = _add_env(partial)
    assert env.show_expected and not CodeRepair(dataclasses.replace(
        FAST_CODE, code_repair_show_expected=False)).make(0).show_expected
    env.reset()
    out = [env.step((*encode("    return 0"), END_ID)) for _ in range(3)]
    assert [o.reward for o in out] == rewards
    assert [o.done for o in out] == [False, False, True] and out[-1].reason == "solved"
    assert sum(o.reward for o in out) == 1.0
    # the body had no final newline: the feedback starts on a new line, then the prompt again
    assert text(out[0].observation) == ("\n# 2/4 tests passed; failed: add(-5, 3) should "
                                        "return -2 (wrong answer)\n" + env.spec.prompt)


def test_code_repair_demonstrations_run_the_sandbox_once_per_spec(
        monkeypatch: pytest.MonkeyPatch) -> None:
    runs = []
    monkeypatch.setattr("rlscope.envs.code_repair.run_tests",
                        lambda *a, **k: runs.append(a) or _result([True] * 4))
    factory = CodeRepair(FAST_CODE)
    demos = [factory.demonstration(seed) for seed in range(60)]
    functions = {factory.make(seed).spec.function for seed in range(60)}
    assert len(runs) == len(functions) >= 2
    for seed, segments in enumerate(demos):
        spec = factory.make(seed).spec
        assert segments == [(encode(spec.prompt), False),
                            ((*encode(spec.reference), END_ID), True)]


def test_code_repair_episode_in_the_sandbox() -> None:
    """A wrong body gets the failing test back, a body that never terminates is killed and
    reported, a syntax error is reported, the revised body solves the episode (four sandbox
    runs, ~2 s)."""
    env = _add_env()
    assert text(env.reset()) == 'def add(a, b):\n    """Return the sum of a and b."""\n'
    wrong = env.step((*encode("    return a - b\n"), END_ID))
    assert text(wrong.observation) == ("# 1/4 tests passed; failed: add(1, 2) should return 3 "
                                       "(wrong answer)\n" + env.spec.prompt)
    assert (wrong.reward, wrong.done) == (0.0, False)
    start = time.monotonic()
    hang = env.step((*encode("    while True:\n        pass\n"), END_ID))
    assert time.monotonic() - start < 10
    # 4 tests × 0.5 s per-test alarm > 1.5 s wall: the wall (or the 1 s CPU) limit kills it
    assert text(hang.observation).startswith("# timeout: ") and not hang.done
    assert text(hang.observation).endswith("s\n" + env.spec.prompt) and hang.reward == 0.0
    broken = env.step((*encode("    return (\n"), END_ID))
    assert text(broken.observation) == ("# crashed: SyntaxError: '(' was never closed (line 3)\n"
                                        + env.spec.prompt)
    assert env.step((*encode("    return a + b\n"), END_ID, *encode("junk"))) == Transition(
        (), 1.0, True, "solved")


def test_code_repair_wrong_bodies_are_plausible_mutations() -> None:
    spec = {s.function: s for s in load_specs()}
    assert wrong_bodies(spec["add"], typos=0) == (
        "    return a - b\n", "    return a + b + 1\n", "    return a\n")
    assert wrong_bodies(spec["digit_sum"], typos=0) == (  # the loop's `for d in` stays
        "    return sum(int(d) for d in str(n)) + 1\n",
        "    return len(int(d) for d in str(n))\n", "    return n\n",
        "    return sum(int(d) for\n")
    # gcd returns its first parameter already: that mutation is dropped (it is the reference)
    assert wrong_bodies(spec["gcd"], typos=0) == (
        "    while b:\n        a, b = b, a // b\n    return a\n",
        "    while b:\n        a, b = b, a % b\n    return a + 1\n",
        "    while b:\n        a, b = b, a % b\n")
    for s in load_specs():
        bodies = wrong_bodies(s)
        structural = wrong_bodies(s, typos=0)
        assert bodies[:len(structural)] == structural and len(bodies) == len(structural) + 20
        assert len(set(bodies)) == len(bodies) and s.reference not in bodies
        assert bodies == wrong_bodies(s)  # drawn from the spec: the same every time
        for typo in bodies[len(structural):]:  # 1–3 edits, never a newline
            assert abs(len(typo) - len(s.reference)) <= 3
            assert typo.count("\n") == s.reference.count("\n")
            assert typo[:4] == s.reference[:4] == "    "  # nor the indentation


def test_code_repair_repair_demonstrations_in_the_sandbox() -> None:
    """The structural wrong bodies of `add` and `gcd`, and a typo'd one, fail their tests in
    the sandbox; the repair episode is the wrong body (`Unlearned`), the environment's real
    feedback and the reference, which solves it on turn 2 (~30 sandbox runs, ~1.5 s)."""
    specs = tuple(s for s in load_specs() if s.function in ("add", "gcd"))
    factory = CodeRepair(dataclasses.replace(FAST_CODE, code_repair_repair_demos=1.0),
                         specs=specs)
    for index, spec in enumerate(factory.specs):
        bodies = wrong_bodies(spec)
        checked = [*range(len(wrong_bodies(spec, typos=0))), len(bodies) - 1]
        for j in checked:
            wrong = bodies[j]
            segments = factory.repair(index, j, max_turns=2)
            result = run_tests(spec.prompt + wrong, spec.function, spec.tests, factory.limits,
                               unsafe=UNSAFE)
            if result.passed == result.total:  # a typo that changes nothing: no repair
                assert segments is None and j >= 3
                continue
            assert segments is not None
            assert [is_policy for _, is_policy in segments] == [False, True, False, True]
            assert isinstance(segments[1][0], Unlearned)
            assert not isinstance(segments[3][0], Unlearned)
            assert segments[1][0] == (*encode(wrong), END_ID)
            assert text(segments[2][0]) == (feedback(spec, result, FAST_CODE.
                                                     code_repair_feedback_chars)
                                            + spec.prompt)
            assert segments[3][0] == (*encode(spec.reference), END_ID)
            env = factory.make(0)  # replay: the same feedback, then turn 2 solves
            env.spec = spec
            env.reset()
            assert env.step(segments[1][0]).observation == segments[2][0]
            assert env.step(segments[3][0]) == Transition((), 1.0, True, "solved")
        assert factory.repair(index, 0, 2) == factory.repair(index, 0, 2)


def _planted_sandbox(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Planted sandbox: a program passes every test iff it ends with its spec's reference."""
    programs: list[str] = []
    references = [s.reference for s in load_specs()]

    def run(program: str, *args: Any, **kwargs: Any) -> SandboxResult:
        programs.append(program)
        return _result([True] * 4 if any(program.endswith(r) for r in references)
                       else [False, True, True, True])

    monkeypatch.setattr("rlscope.envs.code_repair.run_tests", run)
    return programs


def test_code_repair_repair_fraction_is_drawn_from_the_seed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    programs = _planted_sandbox(monkeypatch)

    def demos(frac: float, max_turns: int = 2) -> list[list[Any]]:
        factory = CodeRepair(dataclasses.replace(FAST_CODE, code_repair_repair_demos=frac))
        return [factory.demonstration(seed, max_turns) for seed in range(400)]

    one_turn = demos(0.0)
    plain = CodeRepair(FAST_CODE)
    assert one_turn == [  # FRAC 0: today's one-turn demonstrations, the spec drawn as before
        [(encode(plain.make(seed).spec.prompt), False),
         ((*encode(plain.make(seed).spec.reference), END_ID), True)] for seed in range(400)]
    half = demos(0.5)
    repaired = [len(d) == 4 for d in half]
    assert 0.4 < sum(repaired) / 400 < 0.6 and half == demos(0.5)  # deterministic
    assert [d for d, r in zip(half, repaired, strict=True) if not r] == [
        d for d, r in zip(one_turn, repaired, strict=True) if not r]
    every = demos(1.0)
    assert all(len(d) == 4 for d in every)
    assert len({tuple(d[1][0]) for d in every}) > 20  # the mutation varies with the seed too
    assert all(len(d) == 2 for d in demos(1.0, max_turns=1))  # no room for a repair
    assert programs  # the planted sandbox ran


def test_code_repair_repair_demos_validation() -> None:
    from rlscope.tasks import TaskConfig, make_task

    def errors(frac: float, max_turns: int) -> list[str]:
        env = dataclasses.replace(FAST_CODE, code_repair_repair_demos=frac)
        return make_task("code_repair", TaskConfig(env=env, max_turns=max_turns,
                                                   max_turn_tokens=64,
                                                   max_episode_tokens=320)).validate()

    assert errors(0.5, 2) == [] and errors(0.0, 1) == [] and errors(1.0, 3) == []
    assert errors(1.5, 2) == ["--code_repair_repair_demos must lie in [0, 1] (a fraction of "
                              "the demonstrations; got 1.5)"]
    assert errors(-0.1, 2)[0].startswith("--code_repair_repair_demos must lie in [0, 1]")
    assert errors(0.5, 1) == [
        "--code_repair_repair_demos 0.5 needs --max_turns >= 2 (got 1): a repair "
        "demonstration is a wrong body, its feedback and the reference; raise --max_turns or "
        "set --code_repair_repair_demos 0"]


def test_code_repair_heldout_split_and_limits() -> None:
    train = CodeRepair(FAST_CODE)
    heldout = CodeRepair(dataclasses.replace(FAST_CODE, code_repair_heldout=True))
    assert train.specs and heldout.specs
    assert not {s.function for s in train.specs} & {s.function for s in heldout.specs}
    assert all(s.heldout for s in heldout.specs)
    assert train.limits == SandboxLimits(cpu_seconds=1, wall_seconds=1.5, per_test_seconds=0.5)
    assert {train.make(seed).spec.function for seed in range(100)} == {
        s.function for s in train.specs}


# ---------------------------------------------------------------- docs


def test_docs_transcripts_are_the_demonstrations() -> None:
    from pathlib import Path

    from rlscope.envs.demos import render_transcript

    doc = (Path(__file__).resolve().parents[1] / "docs" / "environments.md").read_text()
    for name, cfg, seed in [("guess_number", EnvConfig(), 1),
                            ("twenty_questions", EnvConfig(), 1),
                            ("calculator_tool", EnvConfig(calculator_difficulty=2), 0)]:
        segments = ENVIRONMENTS[name](cfg).demonstration(seed)
        assert f"```\n{render_transcript(segments, TOKENIZER.decode)}```" in doc, name
    two = [(encode("a\nb\n"), False), ((*encode("c\n"), END_ID), True)]
    assert render_transcript(two, TOKENIZER.decode) == (
        "env    │ a\nenv    │ b\npolicy │ c\npolicy │ <|end|>\n")


def test_env_config_parses_on_the_command_line_with_every_option_documented(
        capsys: pytest.CaptureFixture[str]) -> None:
    """EnvConfig as `rlscope` parses configs (tyro, underscores): flags set fields and
    ``--help`` lists every field with its docstring."""
    import tyro

    def parse(args: list[str]) -> EnvConfig:
        cfg = tyro.cli(EnvConfig, args=args, config=(tyro.conf.OmitArgPrefixes,),
                       use_underscores=True)
        assert isinstance(cfg, EnvConfig)
        return cfg

    assert parse(["--guess_high", "20", "--twenty_questions_answerer", "model",
                  "--code_repair_partial_credit"]) == EnvConfig(
        guess_high=20, twenty_questions_answerer="model", code_repair_partial_credit=True)
    with pytest.raises(SystemExit):
        parse(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for f in dataclasses.fields(EnvConfig):
        assert f"--{f.name}" in help_text
    assert "smallest possible hidden number" in help_text
    assert "killed then and reported" in help_text
