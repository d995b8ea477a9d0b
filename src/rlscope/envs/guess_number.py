"""``guess_number``: find a hidden integer from ``higher`` / ``lower`` answers (issue 20).

Hidden state: an integer uniform in [``guess_low``, ``guess_high``], drawn from the seed.
Initial observation: ``I am thinking of a number from 1 to 100. Guess it.\\n``. Each policy
turn is one line (ended by the newline, the turn's stop token) holding a decimal integer
(ASCII digits, an optional ``-``, spaces around it ignored). The environment answers:

- ``higher\\n`` / ``lower\\n``: the hidden number is larger / smaller than the guess; reward 0;
- the guess is right: the episode ends ``solved`` with reward
  ``max(0.1, 1 − guess_turn_penalty · (t − 1))`` on policy turn t (malformed turns count), no
  observation;
- anything else (empty line, not an integer, out of range, a turn cut off before its newline):
  ``say a number from 1 to 100\\n`` (after a newline when the turn was cut off), reward 0.

Never found within the sampler's turn budget: return 0 (the episode is truncated there).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from rlscope.envs.base import Transition
from rlscope.envs.config import EnvConfig
from rlscope.envs.demos import Segment, play
from rlscope.envs.text import NEWLINE, encode, read_line, solved_reward

_INTEGER = re.compile(r"-?[0-9]{1,18}")


@dataclass
class GuessNumberEnv:
    """One episode: the hidden number and the turns taken so far."""

    low: int
    high: int
    secret: int
    turn_penalty: float
    turns: int = 0

    def reset(self) -> tuple[int, ...]:
        """The rules, in one line."""
        self.turns = 0
        return encode(f"I am thinking of a number from {self.low} to {self.high}. Guess it.\n")

    def step(self, action: tuple[int, ...]) -> Transition:
        """Answer one guess (see the module docstring)."""
        self.turns += 1
        text, terminated = read_line(action)
        guess = text.strip()
        if not terminated or not _INTEGER.fullmatch(guess) \
                or not self.low <= int(guess) <= self.high:
            return Transition(encode(("" if terminated else "\n")
                                     + f"say a number from {self.low} to {self.high}\n"),
                              0.0, False)
        value = int(guess)
        if value == self.secret:
            return Transition((), solved_reward(self.turns, self.turn_penalty), True, "solved")
        return Transition(encode("higher\n" if self.secret > value else "lower\n"), 0.0, False)


class GuessNumber:
    """Factory of ``guess_number`` episodes."""

    name: str = "guess_number"
    vocab_size: int = 256
    turn_stop_token_ids: tuple[int, ...] = (NEWLINE,)

    def __init__(self, cfg: EnvConfig) -> None:
        self.cfg = cfg

    def validate(self) -> list[str]:
        """Problems with the guess_number options, each saying what to change."""
        problems = []
        if self.cfg.guess_low > self.cfg.guess_high:
            problems.append(f"--guess_low ({self.cfg.guess_low}) must be <= --guess_high "
                            f"({self.cfg.guess_high})")
        if max(abs(self.cfg.guess_low), abs(self.cfg.guess_high)) >= 10**18:
            problems.append("--guess_low and --guess_high must have at most 18 digits")
        if not 0.0 <= self.cfg.guess_turn_penalty <= 1.0:
            problems.append(f"--guess_turn_penalty must be in [0, 1] "
                            f"(got {self.cfg.guess_turn_penalty})")
        return problems

    def make(self, seed: int) -> GuessNumberEnv:
        """The episode whose hidden number is drawn from ``seed``."""
        rng = random.Random(seed)
        return GuessNumberEnv(self.cfg.guess_low, self.cfg.guess_high,
                              rng.randint(self.cfg.guess_low, self.cfg.guess_high),
                              self.cfg.guess_turn_penalty)

    def demonstration(self, seed: int, max_turns: int = 64) -> list[Segment]:
        """A binary search of the episode of ``seed`` (optimal: at most ⌈log2(range + 1)⌉
        turns), reading only the environment's answers."""
        bounds = [self.cfg.guess_low, self.cfg.guess_high]

        def policy(segments: list[Segment]) -> tuple[int, ...]:
            if len(segments) > 1:  # narrow by the last answer to the last guess
                guess = int(bytes(segments[-2][0][:-1]).decode())
                answer = bytes(segments[-1][0]).decode()
                if answer == "higher\n":
                    bounds[0] = guess + 1
                else:
                    bounds[1] = guess - 1
            return encode(f"{(bounds[0] + bounds[1]) // 2}\n")

        return play(self.make(seed), policy, max_turns)
