"""The episode protocol: multi-turn environments the policy talks to (issue 20).

An episode starts from an initial observation (the prompt) and alternates *policy segments*
(tokens the policy samples, ended by one of the turn's stop tokens or by the per-turn token
budget) and *environment segments* (tokens the environment answers with). The episode is one
token sequence: the learner sees it as a completion whose loss mask covers the policy segments
only, so every update rule that is valid on sequences trains on episodes unchanged.

The contract, in full:

- `Environment`: one episode's state machine. ``reset`` gives the initial observation tokens;
  ``step`` takes one policy segment (its tokens, the stop token included when one ended it)
  and returns a `Transition`. An environment never raises on what the policy wrote: malformed
  actions get an explanatory observation (and usually reward 0), never an exception. After a
  transition with ``done`` the environment is not stepped again.
- `Transition`: the environment's answer: observation tokens to append (may be empty), the
  turn's reward, ``done``, and why the episode ended when it did.
- `EpisodeBudget`: max turns, max tokens per policy turn, max episode tokens; the episode
  sampler truncates on the first one reached and records the reason (`TRUNCATION_REASONS`).
- `EnvironmentFactory`: what an interactive task exposes (`rlscope.tasks.base.Interactive`):
  builds the environment of one prompt row from a seed, with the turn's stop tokens.
- `BatchStepping` (optional): a factory whose environments step faster together
  (``step_many``: twenty_questions' model answerer answers every question of a position in one
  batched decode); the sampler then steps the turns that end at one position in one call.

Environments are pure Python over token ids (no torch), deterministic given their seed, and
picklable, so slow ones can run in worker processes or Ray actors (`rlscope.env_workers`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

TRUNCATION_REASONS = ("max_turns", "max_turn_tokens", "max_episode_tokens")
"""Why the episode sampler cut an episode short (``episode/truncated_frac/<reason>``)."""

DONE_REASONS = ("solved", "failed", "gave_up", *TRUNCATION_REASONS)
"""Every value `Transition.reason` (or the sampler's truncation) may take."""


@dataclass(frozen=True)
class EpisodeBudget:
    """Limits on one episode (the sampler enforces them; the environment need not)."""

    max_turns: int = 8
    """Most policy turns; the episode is truncated ('max_turns') after the last one."""
    max_turn_tokens: int = 16
    """Most tokens the policy writes in one turn (its stop token included); a turn that reaches
    it without a stop token is handed to the environment as is (truncated turn: the
    environment decides; the sampler records 'max_turn_tokens' only if the episode then ends
    on the budget)."""
    max_episode_tokens: int = 256
    """Most tokens after the initial observation (policy and environment tokens together);
    the episode is truncated ('max_episode_tokens') when the next token would pass it."""

    def validate(self) -> list[str]:
        """Problems with the budget, each saying what to change."""
        problems = []
        for name in ("max_turns", "max_turn_tokens", "max_episode_tokens"):
            if getattr(self, name) < 1:
                problems.append(f"--{name} must be >= 1 (got {getattr(self, name)})")
        if self.max_episode_tokens < self.max_turn_tokens:
            problems.append(f"--max_episode_tokens ({self.max_episode_tokens}) must be >= "
                            f"--max_turn_tokens ({self.max_turn_tokens})")
        return problems


@dataclass(frozen=True)
class Transition:
    """The environment's answer to one policy segment."""

    observation: tuple[int, ...]
    """Tokens appended to the episode after the policy's segment (empty when nothing is said,
    typically when ``done``)."""
    reward: float
    """This turn's reward (the episode's return is the sum over turns, discounted by the
    trainer's per-turn discount where set)."""
    done: bool
    """The episode is over; the environment is not stepped again."""
    reason: str = ""
    """When ``done``: one of 'solved', 'failed', 'gave_up' (`DONE_REASONS`); else empty."""


@runtime_checkable
class Environment(Protocol):
    """One episode's environment (see the module docstring for the contract)."""

    def reset(self) -> tuple[int, ...]:
        """The initial observation tokens (the prompt the policy sees first)."""
        ...

    def step(self, action: tuple[int, ...]) -> Transition:
        """Answer one policy segment (its tokens, the ending stop token included if any)."""
        ...


@runtime_checkable
class EnvironmentFactory(Protocol):
    """Builds per-row environments for an interactive task."""

    name: str
    vocab_size: int
    """Token ids the policy reads and writes (observations use the same ids)."""
    turn_stop_token_ids: tuple[int, ...]
    """Tokens that end a policy turn (the environment answers after them)."""

    def make(self, seed: int) -> Environment:
        """The environment of one episode; ``seed`` fixes its hidden state (rows of one GRPO
        group share a seed and so the same hidden state)."""
        ...


@runtime_checkable
class BatchStepping(Protocol):
    """A factory that steps several of its environments at once (in the trainer's process)."""

    def step_many(self, envs: list[Environment], actions: list[tuple[int, ...]]
                  ) -> list[Transition]:
        """``[env.step(action) for env, action in zip(envs, actions)]``, the same transitions
        and the same state changes, computed together (``envs`` were made by this factory)."""
        ...
