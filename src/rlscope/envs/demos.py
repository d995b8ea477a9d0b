"""Demonstration episodes: a scripted (optimal or good) player for each environment, the
warm-start data of `rlscope sft` for episodes.

An episode is a list of segments ``(tokens, is_policy)``: the initial observation (not the
policy's), then policy and environment segments alternating (an empty observation, typically
the last, is left out). `Demonstrator` is what a factory that can demonstrate exposes; `play`
runs any scripted player against an environment and records the segments. A policy segment
whose tokens are an `Unlearned` tuple is shown but not learnt (a deliberately wrong attempt
that the next turn repairs: code_repair's repair demonstrations).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from rlscope.envs.base import Environment

Segment = tuple[tuple[int, ...], bool]
"""One segment of an episode: its tokens and whether the policy wrote them."""


class Unlearned(tuple[int, ...]):
    """The tokens of a demonstration's policy segment that `rlscope sft` shows in the context
    but leaves out of the loss (mask 0): a deliberately wrong attempt, so that the warm start
    learns to repair it without learning to write it. Equal to the plain tuple of the same
    ids; only the warm start's loss mask (`rlscope.tasks.episodes.EpisodeTask.sft_pairs`)
    reads the mark."""

    __slots__ = ()


@runtime_checkable
class Demonstrator(Protocol):
    """A factory that can play its own episodes well."""

    def demonstration(self, seed: int, max_turns: int = 64) -> list[Segment]:
        """The segments of a good episode of ``seed``: it ends solved within ``max_turns``
        policy turns when the player can solve it."""
        ...


def play(env: Environment, policy: Callable[[list[Segment]], tuple[int, ...]],
         max_turns: int) -> list[Segment]:
    """The segments of ``env``'s episode with ``policy`` (the segments so far → the next
    action) writing each policy turn, until ``done`` or ``max_turns`` policy turns."""
    segments: list[Segment] = [(env.reset(), False)]
    for _ in range(max_turns):
        action = policy(segments)
        segments.append((action, True))
        transition = env.step(action)
        if transition.observation:
            segments.append((transition.observation, False))
        if transition.done:
            break
    return segments


def render_transcript(segments: list[Segment], decode: Callable[[tuple[int, ...]], str]) -> str:
    """An episode as text, one line per line of each segment, tagged ``policy │`` or
    ``env    │`` (``decode`` turns a segment's ids into text)."""
    out = []
    for tokens, is_policy in segments:
        tag = "policy │ " if is_policy else "env    │ "
        out += [tag + line for line in decode(tokens).splitlines()]
    return "\n".join(out) + "\n"
