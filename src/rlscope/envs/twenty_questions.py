"""``twenty_questions``: find a hidden object by asking yes/no questions (issue 20).

Table. `rlscope/data/twenty_questions.json`: 49 hand-written objects (each with optional
aliases) and 27 yes/no attributes (each with the question phrasings that ask it); an object's
``yes`` list names its attributes, every other attribute is ``no``. Every object has a distinct
attribute set, so the oracle's answers can always tell any two objects apart.

Episode. The hidden object is drawn from the seed. Initial observation: ``I am thinking of an
object. Ask yes/no questions, one per line.\\n``. Each policy turn is one line (ended by the
newline, the turn's stop token):

- not ending in ``?`` (or cut off before its newline): ``ask a yes/no question ending in ?\\n``
  (after a newline when the turn was cut off), reward 0;
- ``I give up`` (with or without ``?``): the episode ends ``gave_up``, reward 0;
- a guess of the hidden object (below): the episode ends ``solved`` with reward
  ``max(0.1, 1 − twenty_questions_turn_penalty · (t − 1))`` on policy turn t (1 when the
  penalty is 0, the default), no observation. The environment judges guesses itself, whatever
  the answerer;
- any other question: the answerer's reply (one line), reward 0.

Question grammar (the oracle's; case, repeated spaces and spaces before ``?`` are ignored):
an attribute question is one of the table's phrasings followed by ``?`` (``is it an
animal?``, ``can it fly?``, ``does it fit in your hand?``...), answered ``yes`` / ``no`` from
the table; a guess is ``is it <object>?`` with an optional ``a``, ``an`` or ``the`` before the
object's name or an alias (``is it a dog?``, ``is it the sun?``), answered ``no`` unless it
names the hidden object; anything else is ``I can't answer that``.

Answerers. `Answerer` (question tokens → answer tokens, given the hidden object's name) is the
seam between the environment and whoever answers: `OracleAnswerer` is the rule-based one
(``twenty_questions_answerer="oracle"``); the ``model`` answerer
(`rlscope.tasks.answerer.ModelAnswerer`), an rlscope policy warm-started by
`rlscope sft --task twenty_questions_answerer` on `answerer_sft_pairs` (prompt
`answerer_prompt`), is loaded by the ``twenty_questions`` task from
``--twenty_questions_answerer_path`` and passed to the factory. An answerer that is also a
`BatchAnswerer` answers every question asked at one decoding position in one call
(`TwentyQuestions.step_many`). An answer is cut at its first newline and to
`MAX_ANSWER_BYTES`, and always ends in a newline, whoever wrote it.
"""

from __future__ import annotations

import functools
import json
import random
from dataclasses import dataclass
from importlib import resources
from typing import Protocol, cast, runtime_checkable

from rlscope.envs.base import Environment, Transition
from rlscope.envs.config import EnvConfig
from rlscope.envs.demos import Segment, play
from rlscope.envs.text import NEWLINE, encode, read_line, solved_reward

MAX_ANSWER_BYTES = 48
"""Longest answer (its newline included) the environment passes on from an answerer."""
INTRO = "I am thinking of an object. Ask yes/no questions, one per line.\n"
NEED_QUESTION = "ask a yes/no question ending in ?\n"
CANNOT_ANSWER = "I can't answer that\n"
UNANSWERABLE = ("what is it?", "is it happy?", "how big is it?", "is it expensive?",
                "where is it?")
"""Questions outside the grammar, in the answerer's SFT data (answer: `CANNOT_ANSWER`)."""


@dataclass(frozen=True)
class Table:
    """The objects and their yes/no attributes."""

    names: tuple[str, ...]
    """Object names, in table order."""
    aliases: tuple[tuple[str, ...], ...]
    """Other names of each object (a guess may use them)."""
    attributes: tuple[str, ...]
    """Attribute keys, in table order."""
    phrasings: tuple[tuple[str, ...], ...]
    """The questions (lowercase, no ``?``) asking each attribute; the first is canonical."""
    yes: tuple[frozenset[str], ...]
    """The attributes each object has."""

    def attribute_of(self, question: str) -> str | None:
        """The attribute a normalised question (`normalise`) asks, if any."""
        for key, phrasings in zip(self.attributes, self.phrasings, strict=True):
            if question in phrasings:
                return key
        return None

    def guessed(self, question: str) -> int | None:
        """The object a normalised question guesses (``is it [a|an|the] <name>``), if any."""
        if not question.startswith("is it "):
            return None
        words = question[len("is it "):].split(" ")
        if words[0] in ("a", "an", "the"):
            words = words[1:]
        name = " ".join(words)
        for i, (canonical, others) in enumerate(zip(self.names, self.aliases, strict=True)):
            if name == canonical or name in others:
                return i
        return None


@functools.lru_cache(maxsize=1)
def load_table() -> Table:
    """The shipped table (`rlscope/data/twenty_questions.json`)."""
    raw = json.loads(resources.files("rlscope.data").joinpath("twenty_questions.json")
                     .read_text(encoding="utf-8"))
    return Table(names=tuple(o["name"] for o in raw["objects"]),
                 aliases=tuple(tuple(o["aliases"]) for o in raw["objects"]),
                 attributes=tuple(a["key"] for a in raw["attributes"]),
                 phrasings=tuple(tuple(a["questions"]) for a in raw["attributes"]),
                 yes=tuple(frozenset(o["yes"]) for o in raw["objects"]))


def normalise(question: str) -> str:
    """Lowercase, single spaces, the trailing ``?`` and the spaces around it dropped."""
    return " ".join(question.strip().removesuffix("?").lower().split())


def article(name: str) -> str:
    """``a`` or ``an`` before ``name``."""
    return "an" if name[:1] in "aeiou" else "a"


@runtime_checkable
class Answerer(Protocol):
    """Answers one question about the hidden object."""

    def answer(self, secret: str, question: tuple[int, ...]) -> tuple[int, ...]:
        """The answer tokens (one line) to ``question`` (the policy's tokens, newline
        included) when the hidden object is named ``secret``."""
        ...


@runtime_checkable
class BatchAnswerer(Protocol):
    """An answerer that answers many questions at once (a model: one batched decode)."""

    def answer_many(self, secrets: list[str], questions: list[tuple[int, ...]]
                    ) -> list[tuple[int, ...]]:
        """``[answer(s, q) for s, q in zip(secrets, questions)]``, computed together."""
        ...


def answer_all(answerer: Answerer, secrets: list[str], questions: list[tuple[int, ...]]
               ) -> list[tuple[int, ...]]:
    """The answers to ``questions`` (about ``secrets``), in one call where ``answerer`` is a
    `BatchAnswerer`."""
    if not questions:
        return []
    if isinstance(answerer, BatchAnswerer):
        return answerer.answer_many(secrets, questions)
    return [answerer.answer(s, q) for s, q in zip(secrets, questions, strict=True)]


@dataclass(frozen=True)
class OracleAnswerer:
    """The rule-based answerer over the table (the module docstring's question grammar)."""

    table: Table

    def answer(self, secret: str, question: tuple[int, ...]) -> tuple[int, ...]:
        """``yes\\n`` / ``no\\n`` for attribute questions and guesses, else
        `CANNOT_ANSWER`."""
        return encode(self.answer_text(secret, read_line(question)[0]))

    def answer_text(self, secret: str, question: str) -> str:
        """The answer to the question text ``question``."""
        q = normalise(question)
        index = self.table.names.index(secret)
        if (key := self.table.attribute_of(q)) is not None:
            return "yes\n" if key in self.table.yes[index] else "no\n"
        if (guess := self.table.guessed(q)) is not None:
            return "yes\n" if guess == index else "no\n"
        return CANNOT_ANSWER


def answerer_prompt(secret: str, question: str) -> str:
    """What a model answerer reads: the hidden object and the question (then it writes the
    answer line)."""
    return f"object: {secret}\nquestion: {question.strip()}\n"


def answerer_sft_pairs(table: Table | None = None) -> list[tuple[list[int], list[int]]]:
    """The table as supervised pairs ``(answerer_prompt ids, answer ids)`` for the model
    answerer's `rlscope sft` warm start: for every object, every attribute phrasing, a guess of
    every object (``is it a <name>?``) and the `UNANSWERABLE` questions, answered by the
    oracle."""
    table = table or load_table()
    oracle = OracleAnswerer(table)
    questions = [f"{p}?" for phrasings in table.phrasings for p in phrasings]
    questions += [f"is it {article(n)} {n}?" for n in table.names]
    questions += list(UNANSWERABLE)
    return [(list(encode(answerer_prompt(secret, q))), list(encode(oracle.answer_text(secret, q))))
            for secret in table.names for q in questions]


def secret_index(seed: int, table: Table) -> int:
    """The hidden object (its index in ``table``) of the episode of ``seed``."""
    return random.Random(seed).randrange(len(table.names))


def clean_answer(answer: tuple[int, ...]) -> tuple[int, ...]:
    """An answerer's tokens as one line: cut at the first newline and to
    `MAX_ANSWER_BYTES` − 1 ids, then a newline."""
    text, _ = read_line(answer)
    line = text.encode("utf-8")[:MAX_ANSWER_BYTES - 1]
    return (*line, NEWLINE)


@dataclass
class TwentyQuestionsEnv:
    """One episode: the hidden object, the answerer and the turns taken so far."""

    table: Table
    secret: int
    answerer: Answerer
    turn_penalty: float
    turns: int = 0

    def reset(self) -> tuple[int, ...]:
        """The rules, in one line."""
        self.turns = 0
        return encode(INTRO)

    @property
    def secret_name(self) -> str:
        """The hidden object's name (what the answerer is told)."""
        return self.table.names[self.secret]

    def judge(self, action: tuple[int, ...]) -> Transition | None:
        """Take one policy turn: its transition, or None when it is a question for the
        answerer (then `answered` gives the transition)."""
        self.turns += 1
        text, terminated = read_line(action)
        question = normalise(text)
        if terminated and question == "i give up":
            return Transition((), 0.0, True, "gave_up")
        if not terminated or not text.rstrip().endswith("?"):
            return Transition(encode(("" if terminated else "\n") + NEED_QUESTION), 0.0, False)
        if self.table.attribute_of(question) is None \
                and self.table.guessed(question) == self.secret:
            return Transition((), solved_reward(self.turns, self.turn_penalty), True, "solved")
        return None

    @staticmethod
    def answered(answer: tuple[int, ...]) -> Transition:
        """The transition of a question the answerer answered with ``answer``."""
        return Transition(clean_answer(answer), 0.0, False)

    def step(self, action: tuple[int, ...]) -> Transition:
        """Answer one question (see the module docstring)."""
        judged = self.judge(action)
        if judged is not None:
            return judged
        return self.answered(self.answerer.answer(self.secret_name, tuple(action)))


class TwentyQuestions:
    """Factory of ``twenty_questions`` episodes."""

    name: str = "twenty_questions"
    vocab_size: int = 256
    turn_stop_token_ids: tuple[int, ...] = (NEWLINE,)

    def __init__(self, cfg: EnvConfig, answerer: Answerer | None = None,
                 table: Table | None = None) -> None:
        """``answerer``: the model answerer (needed when ``cfg.twenty_questions_answerer`` is
        'model'; the oracle otherwise); ``table``: default the shipped one."""
        self.cfg = cfg
        self.table = table or load_table()
        self.answerer: Answerer | None = (OracleAnswerer(self.table)
                                          if cfg.twenty_questions_answerer == "oracle"
                                          else answerer)

    def validate(self) -> list[str]:
        """Problems with the twenty_questions options, each saying what to change."""
        problems = []
        if self.cfg.twenty_questions_answerer not in ("oracle", "model"):
            problems.append(f"--twenty_questions_answerer must be 'oracle' or 'model' "
                            f"(got {self.cfg.twenty_questions_answerer!r})")
        elif self.answerer is None and not self.cfg.twenty_questions_answerer_path:
            problems.append("--twenty_questions_answerer model needs "
                            "--twenty_questions_answerer_path DIR (the output of rlscope sft "
                            "--task twenty_questions_answerer), or use "
                            "--twenty_questions_answerer oracle")
        if not 0.0 <= self.cfg.twenty_questions_turn_penalty <= 1.0:
            problems.append(f"--twenty_questions_turn_penalty must be in [0, 1] "
                            f"(got {self.cfg.twenty_questions_turn_penalty})")
        return problems

    def step_many(self, envs: list[Environment], actions: list[tuple[int, ...]]
                  ) -> list[Transition]:
        """Step ``envs`` (this factory's) on ``actions``: the questions for the answerer are
        answered in one `answer_all` call (one batched decode for a model answerer)."""
        episodes = [cast(TwentyQuestionsEnv, env) for env in envs]
        judged = [env.judge(action) for env, action in zip(episodes, actions, strict=True)]
        asking = [i for i, t in enumerate(judged) if t is None]
        if asking and self.answerer is None:
            raise ValueError("twenty_questions: no answerer (see validate)")
        answers = answer_all(cast(Answerer, self.answerer),
                             [episodes[i].secret_name for i in asking],
                             [tuple(actions[i]) for i in asking])
        for i, answer in zip(asking, answers, strict=True):
            judged[i] = TwentyQuestionsEnv.answered(answer)
        return [t for t in judged if t is not None]

    def make(self, seed: int) -> TwentyQuestionsEnv:
        """The episode whose hidden object is drawn from ``seed``."""
        if self.answerer is None:
            raise ValueError("twenty_questions: no answerer (see validate)")
        secret = secret_index(seed, self.table)
        return TwentyQuestionsEnv(self.table, secret, self.answerer,
                                  self.cfg.twenty_questions_turn_penalty)

    def demonstration(self, seed: int, max_turns: int = 64) -> list[Segment]:
        """A greedy decision tree: ask the canonical question of the attribute that splits the
        objects still possible most evenly, keep those matching the answer, and guess when one
        is left (at most 9 turns on the shipped table, 6.9 on average over its objects);
        gives up if answers contradict the
        table."""
        table = self.table
        candidates = list(range(len(table.names)))
        asked: list[str] = []

        def policy(segments: list[Segment]) -> tuple[int, ...]:
            if asked:
                has = bytes(segments[-1][0]) == b"yes\n"
                candidates[:] = [i for i in candidates if (asked[-1] in table.yes[i]) == has]
            if len(candidates) == 1:
                name = table.names[candidates[0]]
                return encode(f"is it {article(name)} {name}?\n")
            if not candidates:
                return encode("I give up\n")
            key = min(table.attributes, key=lambda k: abs(
                2 * sum(k in table.yes[i] for i in candidates) - len(candidates)))
            asked.append(key)
            return encode(f"{table.phrasings[table.attributes.index(key)][0]}?\n")

        return play(self.make(seed), policy, max_turns)
