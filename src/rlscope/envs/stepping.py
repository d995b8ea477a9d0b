"""One environment step, timed and contained, in this process or in a worker process.

`timed_step` is what the episode sampler (`rlscope.sampling.episodes`) runs for every policy
turn: in the trainer's process, or in a worker of its process pool (``--env_processes``), where
the environment travels with the call and comes back with its new state (environments are
picklable, see `rlscope.envs.base`). Torch-free, so a worker starts without importing it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from rlscope.envs.base import Environment, Transition

ERROR_REASON = "failed"
"""The end reason of an episode whose environment raised."""


@dataclass(frozen=True)
class StepResult:
    """The environment after its step, the transition, the seconds the step took, and
    whether it raised (then the transition ends the episode 'failed' with reward 0)."""

    env: Environment
    transition: Transition
    seconds: float
    error: bool = False


def timed_step(env: Environment, action: tuple[int, ...]) -> StepResult:
    """``env.step(action)``, timed; an exception (which the protocol forbids) ends the episode
    'failed' instead of escaping."""
    t0 = time.perf_counter()
    try:
        transition = env.step(action)
        error = False
    except Exception:  # the contract forbids it; the episode ends, the run goes on
        transition = Transition(observation=(), reward=0.0, done=True, reason=ERROR_REASON)
        error = True
    return StepResult(env, transition, time.perf_counter() - t0, error)


StepMany = Callable[[list[Environment], list[tuple[int, ...]]], list[Transition]]
"""A factory's ``step_many`` (`rlscope.envs.base.BatchStepping`)."""


def timed_steps(envs: list[Environment], actions: list[tuple[int, ...]],
                step_many: StepMany | None = None) -> list[StepResult]:
    """`timed_step` of each ``(env, action)``; with ``step_many`` all of them in one call,
    each charged an equal share of its seconds. If that call raises, every episode of the call
    ends 'failed' (its environments may have changed part-way)."""
    if step_many is None or len(envs) < 2:
        return [timed_step(env, action) for env, action in zip(envs, actions, strict=True)]
    t0 = time.perf_counter()
    try:
        transitions = step_many(envs, actions)
        errors = [False] * len(envs)
    except Exception:  # the contract forbids it; the episodes end, the run goes on
        transitions = [Transition(observation=(), reward=0.0, done=True, reason=ERROR_REASON)
                       ] * len(envs)
        errors = [True] * len(envs)
    seconds = (time.perf_counter() - t0) / len(envs)
    return [StepResult(env, transition, seconds, error)
            for env, transition, error in zip(envs, transitions, errors, strict=True)]
