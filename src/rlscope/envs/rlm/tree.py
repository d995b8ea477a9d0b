"""The tree driver of ``rlm_grpo`` (COMPANIONS.md section 4): root rollouts in a REPL, children
spawned by ``rlm_query*``, the record of every generated segment, and the credit weights.

Model-agnostic: the policy is a ``generate(conversations, max_new_tokens) -> texts`` callable
(one text per conversation, a conversation being a list of ``{"role", "content"}`` messages),
and prompt lengths come from a ``count_tokens(conversation)`` callable.

A root turn: the model writes; the FIRST ```` ```repl ```` block runs in the root's
`ReplSession`; its observation (or ``no repl block``) is the next user message. A FINAL ends
the root; so do ``max_root_turns`` (no answer, ``max_turns``) and a conversation over
``max_prompt_tokens`` (no answer, ``context_limit``). ``rlm_query*`` calls from the root's
block run the children (each in its own session with the child tools, up to
``max_child_turns``, in lockstep) while the block's clock is paused; the children's answers
return into the block. Roots of several trees also run in lockstep (one ``generate`` call per
turn for all of them).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from rlscope.envs.rlm.config import RlmConfig
from rlscope.envs.rlm.data import RlmExample
from rlscope.envs.rlm.prompts import (
    NO_BLOCK,
    Conversation,
    child_conversation,
    first_repl_block,
    observation_message,
    root_conversation,
)
from rlscope.sandbox.repl import ReplLimits, ReplResult, ReplSession

TOOLS_SOURCE = Path(__file__).with_name("tools.py").read_text(encoding="utf-8")
"""The tools every session of a tree is set up with (`rlscope.envs.rlm.tools`)."""
Finish = Literal["final", "max_turns", "context_limit"]
TEXT_CONTEXT = "(given text)"
"""A child's ``paper_id`` when the root passed a text rather than a paper id."""


class Generate(Protocol):
    """The policy: one completion per conversation, at most ``max_new_tokens`` tokens each."""

    def __call__(self, conversations: Sequence[Conversation],
                 max_new_tokens: int) -> list[str]: ...


CountTokens = Callable[[Conversation], int]


@dataclass(frozen=True)
class Segment:
    """One generated turn: ``child`` None for the root, else the child's index in the tree
    (0-based, in spawning order); ``turn`` 0-based; ``prompt`` the conversation it was
    generated from (its tokens are masked in the loss); ``text`` the generated text."""

    child: int | None
    turn: int
    prompt: tuple[dict[str, str], ...]
    text: str


@dataclass(frozen=True)
class ChildRecord:
    """One child: its request, its paper (id, or `TEXT_CONTEXT`), its answer (None without
    FINAL), its number of turns and why it ended."""

    index: int
    prompt: str
    paper_id: str
    answer: Any
    has_final: bool
    turns: int
    finish: Finish


@dataclass(frozen=True)
class TreeRecord:
    """One whole tree. ``segments`` in generation order (root and children interleaved);
    ``final`` the root's answer (plain data, or a repr for other values; None without FINAL);
    the counters cover every session of the tree."""

    example_id: str
    segments: tuple[Segment, ...]
    has_final: bool
    final: Any
    finish: Finish
    root_turns: int
    children: tuple[ChildRecord, ...]
    repl_blocks: int
    repl_errors: int
    repl_timeouts: int
    budget_refusals: int

    @property
    def root_segments(self) -> int:
        return sum(s.child is None for s in self.segments)

    @property
    def child_segments(self) -> int:
        return sum(s.child is not None for s in self.segments)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for ``samples.jsonl``."""
        return asdict(self)


@dataclass
class _Rollout:
    """A root or child under way."""

    conversation: Conversation
    session: ReplSession
    child: int | None
    turns: int = 0
    done: bool = False
    has_final: bool = False
    final: Any = None
    finish: Finish = "max_turns"


@dataclass
class _Tree:
    example: RlmExample
    root: _Rollout | None = None
    segments: list[Segment] = field(default_factory=list)
    children: list[ChildRecord] = field(default_factory=list)
    blocks: int = 0
    errors: int = 0
    timeouts: int = 0
    refusals: int = 0


def session_limits(cfg: RlmConfig, turns: int) -> ReplLimits:
    """A session's limits: the block clock ``repl_timeout``, RLIMIT_CPU ``repl_timeout`` ×
    ``turns``, observations cut to ``max_observation_chars``."""
    return ReplLimits(block_seconds=cfg.repl_timeout,
                      cpu_seconds=max(1, math.ceil(cfg.repl_timeout * turns)),
                      max_observation_chars=cfg.max_observation_chars)


def start_sessions(sessions: Sequence[ReplSession]) -> None:
    """Launch the sessions that are not running, so that they boot at the same time (a start
    is mostly waiting for a new interpreter; the blocks then run one at a time)."""
    for session in sessions:
        session.launch()


class TreeRunner:
    """Runs trees with one policy and one configuration (`run_trees`)."""

    def __init__(self, generate: Generate, cfg: RlmConfig, count_tokens: CountTokens) -> None:
        self.generate, self.cfg, self.count_tokens = generate, cfg, count_tokens

    def _texts(self, rollouts: Sequence[_Rollout], max_new_tokens: int) -> list[str]:
        texts = self.generate([r.conversation for r in rollouts], max_new_tokens)
        if len(texts) != len(rollouts) or not all(isinstance(t, str) for t in texts):
            raise ValueError(f"generate returned {len(texts)} texts for {len(rollouts)} "
                             "conversations (want one string each)")
        return texts

    def _step(self, rollouts: list[tuple[_Tree, _Rollout]], max_new_tokens: int,
              max_turns: int) -> None:
        """One lockstep turn: one generate call for every rollout still under its context
        limit, then each one's block in turn (a root's children run inside its block)."""
        live = []
        for t, r in rollouts:
            if self.count_tokens(r.conversation) > self.cfg.max_prompt_tokens:
                r.done, r.finish = True, "context_limit"
            else:
                live.append((t, r))
        if not live:
            return
        texts = self._texts([r for _, r in live], max_new_tokens)
        start_sessions([r.session for (_, r), text in zip(live, texts, strict=True)
                        if first_repl_block(text) is not None])
        for (t, r), text in zip(live, texts, strict=True):
            self._advance(t, r, text, max_turns)

    def _advance(self, tree: _Tree, r: _Rollout, text: str, max_turns: int) -> None:
        """Record ``text`` as ``r``'s next segment, run its first REPL block, and end ``r``
        (FINAL, turn limit) or append the observation."""
        tree.segments.append(Segment(r.child, r.turns, tuple(dict(m) for m in r.conversation),
                                     text))
        r.turns += 1
        r.conversation.append({"role": "assistant", "content": text})
        code = first_repl_block(text)
        if code is None:
            observation = NO_BLOCK
        else:
            result = r.session.run(code)
            self._count(tree, result)
            if result.has_final:
                r.done, r.has_final, r.final, r.finish = True, True, result.final, "final"
                return
            observation = observation_message(result.observation)
        if r.turns >= max_turns:
            r.done, r.finish = True, "max_turns"
            return
        r.conversation.append({"role": "user", "content": observation})

    @staticmethod
    def _count(tree: _Tree, result: ReplResult) -> None:
        tree.blocks += 1
        tree.errors += result.status != "ok"
        tree.timeouts += result.status == "timeout"

    def _children(self, tree: _Tree, payload: Any) -> Any:
        """The parent's answer to an ``rlm_query*`` request of ``tree``'s root."""
        cfg = self.cfg
        prompts = payload.get("prompts") if isinstance(payload, dict) else None
        contexts = payload.get("contexts") if isinstance(payload, dict) else None
        if (not isinstance(prompts, list) or not isinstance(contexts, list)
                or len(prompts) != len(contexts)
                or not all(isinstance(x, str) for x in prompts + contexts)):
            return {"error": ["TypeError", "rlm_query: prompts and contexts must be strings"]}
        k, used = len(prompts), len(tree.children)
        if k > cfg.max_children_per_call:
            tree.refusals += 1
            return {"error": ["BudgetError", f"{k} children in one call: at most "
                              f"{cfg.max_children_per_call} (max_children_per_call)"]}
        if used + k > cfg.max_children:
            tree.refusals += 1
            return {"error": ["BudgetError", f"{k} more children would exceed "
                              f"max_children={cfg.max_children} per question ({used} used)"]}
        papers = tree.example.papers
        kids = []
        for i, (prompt, context) in enumerate(zip(prompts, contexts, strict=True)):
            pid = context if context in papers else TEXT_CONTEXT
            text = papers.get(context, context)
            session = ReplSession(TOOLS_SOURCE, {"kind": "child", "paper": text,
                                                 "paper_id": pid},
                                  session_limits(cfg, cfg.max_child_turns),
                                  unsafe=cfg.unsafe_sandbox)
            kids.append((prompt, pid, _Rollout(child_conversation(prompt, pid), session,
                                               used + i)))
        try:
            for _ in range(cfg.max_child_turns):
                live = [(tree, r) for _, _, r in kids if not r.done]
                if not live:
                    break
                self._step(live, cfg.max_child_tokens, cfg.max_child_turns)
        finally:
            for _, _, r in kids:
                r.session.close()
        answers = []
        for i, (prompt, pid, r) in enumerate(kids):
            tree.children.append(ChildRecord(used + i, prompt, pid, r.final, r.has_final,
                                             r.turns, r.finish))
            answers.append(r.final)
        return {"answers": answers}

    def run(self, examples: Sequence[RlmExample]) -> list[TreeRecord]:
        """One tree per example, roots in lockstep (module docstring)."""
        cfg = self.cfg
        trees = [_Tree(e) for e in examples]
        try:
            for tree in trees:
                tree.root = _Rollout(
                    root_conversation(tree.example.question, tree.example.papers),
                    ReplSession(TOOLS_SOURCE, {"kind": "root", "papers": tree.example.papers},
                                session_limits(cfg, cfg.max_root_turns),
                                on_request=functools.partial(self._children, tree),
                                unsafe=cfg.unsafe_sandbox), None)
            for _ in range(cfg.max_root_turns):
                live = [(t, t.root) for t in trees if t.root is not None and not t.root.done]
                if not live:
                    break
                self._step(live, cfg.max_plan_tokens, cfg.max_root_turns)
        finally:
            for tree in trees:
                if tree.root is not None:
                    tree.root.session.close()
        return [self._record(t) for t in trees]

    @staticmethod
    def _record(tree: _Tree) -> TreeRecord:
        r = tree.root
        assert r is not None
        return TreeRecord(tree.example.id, tuple(tree.segments), r.has_final, r.final, r.finish,
                          r.turns, tuple(tree.children), tree.blocks, tree.errors,
                          tree.timeouts, tree.refusals)


def run_trees(examples: Sequence[RlmExample], generate: Generate, cfg: RlmConfig,
              count_tokens: CountTokens) -> list[TreeRecord]:
    """One tree per example (module docstring); sessions are closed on return or error."""
    return TreeRunner(generate, cfg, count_tokens).run(examples)


def credit_weights(n_root_turns: int, child_turns: Sequence[int],
                   train_child_trajectories: bool = True
                   ) -> tuple[list[float], list[list[float]]]:
    """Per-turn loss weights of one tree (COMPANIONS.md section 4, credit step 3): each of the
    ``n_root_turns`` root turns 1/n_root (the root sums to 1); each turn of child j of the k
    children that have turns, with n_j turns, 1/(k·n_j) (the children sum to 1 whatever k);
    every child weight 0 when ``train_child_trajectories`` is False. Returns (root weights,
    per-child weights)."""
    if n_root_turns < 0 or any(n < 0 for n in child_turns):
        raise ValueError("turn counts must be >= 0")
    root = [1.0 / n_root_turns] * n_root_turns
    k = sum(n > 0 for n in child_turns)
    children = [[1.0 / (k * n) if train_child_trajectories else 0.0] * n if n else []
                for n in child_turns]
    return root, children


def segment_weights(tree: TreeRecord, train_child_trajectories: bool = True) -> list[float]:
    """`credit_weights` aligned with ``tree.segments``."""
    n_children = 1 + max((s.child for s in tree.segments if s.child is not None), default=-1)
    child_turns = [sum(s.child == j for s in tree.segments) for j in range(n_children)]
    root, children = credit_weights(tree.root_segments, child_turns, train_child_trajectories)
    return [root[s.turn] if s.child is None else children[s.child][s.turn]
            for s in tree.segments]
