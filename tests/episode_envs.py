"""Small deterministic environments for the episode sampler's tests (tests/test_episodes.py).

Token ids (vocabulary 8): 0 pad, 1 the turn stop token, 5 the target the policy must write,
2..4 and 6..7 ordinary symbols.

- `EchoFactory` ("echo"): the initial observation is ``2 3`` followed by ``seed % 3`` fours
  (its length varies by seed); a turn holding the target 5 ends the episode 'solved' with
  reward 1; any other turn is answered with ``1 + (seed + turn) % 3`` sixes and a seven
  (observations of varying length) and reward ``turn_reward``. With ``exact`` only the turn
  ``5 1`` solves it; a turn holding 5 otherwise earns 0.2 and goes on (a harder task for the
  training test, whose groups stay mixed).
- `EndlessFactory` ("endless"): never ends; answers each turn with ``answer_len`` sixes.
- `RaisingFactory` ("raising"): its step raises (an environment breaking the contract).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from rlscope.envs.base import Transition

VOCAB = 8
STOP = 1
TARGET = 5


@dataclass
class EchoEnv:
    seed: int
    turn_reward: float = 0.0
    exact: bool = False
    turn: int = 0

    def reset(self) -> tuple[int, ...]:
        return (2, 3, *([4] * (self.seed % 3)))

    def step(self, action: tuple[int, ...]) -> Transition:
        self.turn += 1
        if action == (TARGET, STOP) or (TARGET in action and not self.exact):
            return Transition(observation=(), reward=1.0, done=True, reason="solved")
        return Transition(observation=(*([6] * (1 + (self.seed + self.turn) % 3)), 7),
                          reward=0.2 if TARGET in action else self.turn_reward, done=False)


@dataclass
class EchoFactory:
    turn_reward: float = 0.0
    exact: bool = False
    name: str = "echo"
    vocab_size: int = VOCAB
    turn_stop_token_ids: tuple[int, ...] = (STOP,)

    def make(self, seed: int) -> EchoEnv:
        return EchoEnv(seed, self.turn_reward, self.exact)


@dataclass
class EndlessEnv:
    answer_len: int

    def reset(self) -> tuple[int, ...]:
        return (2, 3)

    def step(self, action: tuple[int, ...]) -> Transition:
        return Transition(observation=(6,) * self.answer_len, reward=0.25, done=False)


@dataclass
class EndlessFactory:
    answer_len: int = 2
    name: str = "endless"
    vocab_size: int = VOCAB
    turn_stop_token_ids: tuple[int, ...] = (STOP,)

    def make(self, seed: int) -> EndlessEnv:
        return EndlessEnv(self.answer_len)


class RaisingEnv:
    def reset(self) -> tuple[int, ...]:
        return (2, 3)

    def step(self, action: tuple[int, ...]) -> Transition:
        raise RuntimeError("broken environment")


@dataclass
class RaisingFactory:
    name: str = "raising"
    vocab_size: int = VOCAB
    turn_stop_token_ids: tuple[int, ...] = (STOP,)

    def make(self, seed: int) -> RaisingEnv:
        return RaisingEnv()


@dataclass
class SlowEchoFactory:
    """`EchoFactory` whose steps sleep ``seconds`` (a slow tool or sandbox)."""

    seconds: float = 0.05
    name: str = "slow_echo"
    vocab_size: int = VOCAB
    turn_stop_token_ids: tuple[int, ...] = (STOP,)

    def make(self, seed: int) -> SlowEchoEnv:
        return SlowEchoEnv(seed, seconds=self.seconds)


@dataclass
class SlowEchoEnv(EchoEnv):
    seconds: float = 0.05

    def step(self, action: tuple[int, ...]) -> Transition:
        time.sleep(self.seconds)
        return super().step(action)


class DyingEnv:
    """Its step kills the process it runs in (a worker crash: segfault, OOM kill)."""

    def reset(self) -> tuple[int, ...]:
        return (2, 3)

    def step(self, action: tuple[int, ...]) -> Transition:
        os._exit(3)


@dataclass
class DyingFactory:
    name: str = "dying"
    vocab_size: int = VOCAB
    turn_stop_token_ids: tuple[int, ...] = (STOP,)

    def make(self, seed: int) -> DyingEnv:
        return DyingEnv()
