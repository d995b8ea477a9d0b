"""The RLM tree driver: credit weights by hand and summing to 1 for the root and for the children
whatever their number; a scripted policy drives whole trees on the shipped data to char_f1 = 1,
and its recorded conversations are exactly the scripted warm-start transcripts; budgets,
child answers, missing blocks, turn and context limits and a REPL timeout inside a tree."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

import pytest

from rlscope.envs.rlm import (
    ChildRecord,
    RlmConfig,
    ScriptedPolicy,
    Segment,
    TreeRecord,
    TreeScore,
    char_f1,
    credit_weights,
    load_examples,
    run_trees,
    score_tree,
    segment_weights,
    sft_pairs,
    tree_metrics,
)
from rlscope.envs.rlm.prompts import CHILD_SYSTEM_PROMPT, NO_BLOCK, Conversation
from rlscope.sandbox import isolation_problem

CFG = RlmConfig(unsafe_sandbox=bool(isolation_problem()), repl_timeout=5.0)
"""The isolated sandbox where it works (the weak one elsewhere, so the driver is still tested)."""


def chars(conversation: Conversation) -> int:
    """A stand-in token count: characters / 4."""
    return sum(len(m["content"]) for m in conversation) // 4


@pytest.fixture(scope="module")
def examples() -> list:
    """One train example of each question type."""
    train = [e for e in load_examples() if e.split == "train"]
    picked = {}
    for e in train:
        kind = ("lookup" if e.question.startswith("Which papers report") else
                "comparison" if "highest" in e.question else "attribution")
        picked.setdefault(kind, e)
    return list(picked.values())


class Canned:
    """A policy returning ``root[t]`` / ``child[t]`` at turn t (the last one after that) and
    recording every conversation it was given."""

    def __init__(self, root: list[str], child: Sequence[str] = ("no block",)) -> None:
        self.root, self.child = root, list(child)
        self.seen: list[Conversation] = []

    def __call__(self, conversations: Sequence[Conversation], max_new_tokens: int) -> list[str]:
        out = []
        for c in conversations:
            self.seen.append([dict(m) for m in c])
            script = self.child if c[0]["content"] == CHILD_SYSTEM_PROMPT else self.root
            turn = sum(m["role"] == "assistant" for m in c)
            out.append(script[min(turn, len(script) - 1)])
        return out


def block(code: str) -> str:
    return f"Let me look.\n```repl\n{code}\n```\nand text after"


def test_credit_weights_by_hand() -> None:
    root, children = credit_weights(4, [2, 3])
    assert root == [0.25] * 4
    assert children == [[1 / 4, 1 / 4], [1 / 6, 1 / 6, 1 / 6]]  # 1/(k·n_j), k = 2
    assert credit_weights(2, [0, 2]) == ([0.5, 0.5], [[], [0.5, 0.5]])  # k counts children
    assert credit_weights(3, [2], train_child_trajectories=False) == ([1 / 3] * 3, [[0.0, 0.0]])
    assert credit_weights(1, []) == ([1.0], [])


def test_weights_sum_to_one_for_root_and_children_whatever_k() -> None:
    rng = random.Random(0)
    for _ in range(200):
        n_root = rng.randint(1, 10)
        turns = [rng.randint(1, 10) for _ in range(rng.randint(1, 8))]
        root, children = credit_weights(n_root, turns)
        assert sum(root) == pytest.approx(1.0)
        assert sum(map(sum, children)) == pytest.approx(1.0)
        assert all(w == pytest.approx(1 / (len(turns) * n)) for ws, n in zip(children, turns,
                                                                              strict=True)
                   for w in ws)
        assert sum(map(sum, credit_weights(n_root, turns, False)[1])) == 0.0


def test_scripted_policy_drives_whole_trees_to_char_f1_one(examples: list) -> None:
    trees = run_trees(examples, ScriptedPolicy(examples), CFG, chars)
    for e, tree in zip(examples, trees, strict=True):
        assert (tree.finish, tree.has_final, tree.root_turns) == ("final", True, 3)
        assert tree.final == [g.text for g in e.gold]
        score = char_f1(tree.final, e.papers, e.gold, CFG.max_reward_predictions)
        assert (score.reward, score.precision, score.recall) == (1.0, 1.0, 1.0)
        (child,) = tree.children
        assert (child.paper_id, child.turns, child.finish) == (e.gold[0].paper_id, 2, "final")
        assert child.answer == [g.text for g in e.gold if g.paper_id == e.gold[0].paper_id]
        assert (tree.repl_blocks, tree.repl_errors, tree.repl_timeouts,
                tree.budget_refusals) == (5, 0, 0, 0)
        assert [(s.child, s.turn) for s in tree.segments] == [
            (None, 0), (None, 1), (0, 0), (0, 1), (None, 2)]
        assert segment_weights(tree) == [1 / 3, 1 / 3, 1 / 2, 1 / 2, 1 / 3]
        assert segment_weights(tree, False) == [1 / 3, 1 / 3, 0.0, 0.0, 1 / 3]
        assert tree.to_dict()["segments"][2]["child"] == 0


def test_recorded_conversations_are_the_warm_start_transcripts(examples: list) -> None:
    """`sft_pairs` computes the observations without a sandbox; the real run printed the same."""
    trees = run_trees(examples, ScriptedPolicy(examples), CFG, chars)
    pairs = sft_pairs(examples, CFG.max_observation_chars)
    assert len(pairs) == 2 * len(examples)
    for tree, (root, root_mask), (child, child_mask) in zip(trees, pairs[::2], pairs[1::2],
                                                            strict=True):
        last_root = [s for s in tree.segments if s.child is None][-1]
        last_child = [s for s in tree.segments if s.child == 0][-1]
        assert [*last_root.prompt, {"role": "assistant", "content": last_root.text}] == root
        assert [*last_child.prompt, {"role": "assistant", "content": last_child.text}] == child
        assert root_mask == [False, False, True, False, True, False, True]
        assert child_mask == [False, False, True, False, True]


def test_budgets_raise_budget_error_and_spawn_nothing(examples: list) -> None:
    e = examples[0]
    policy = Canned([block("try:\n    rlm_query_batched(['q'] * 3, ['P1'] * 3)\n"
                           "except BudgetError as err:\n    print('refused:', err)"),
                     block("rlm_query('q', context='P1')"),
                     block("FINAL('done')")])
    (tree,) = run_trees([e], policy, replace(CFG, max_children=2, max_children_per_call=2,
                                             max_child_turns=2), chars)
    assert tree.budget_refusals == 1
    assert tree.segments[1].prompt[-1]["content"] == (
        "refused: 3 children in one call: at most 2 (max_children_per_call)\n")
    (child,) = tree.children  # only the second, legal call spawned one
    assert (child.prompt, child.turns, child.finish, child.answer) == ("q", 2, "max_turns", None)
    (tree,) = run_trees([e], policy, replace(CFG, max_children=0), chars)
    assert tree.children == () and tree.budget_refusals == 2 and tree.repl_errors == 1
    assert tree.segments[2].prompt[-1]["content"] == (
        "BudgetError: 1 more children would exceed max_children=0 per question (0 used)")
    assert (tree.final, tree.finish) == ("done", "final")


def test_child_answers_return_through_literal_eval(examples: list) -> None:
    e = examples[0]
    root = block("a = rlm_query_batched(['x', 'y', 'z'], ['P1', 'P2', 'some text'])\n"
                 "print([type(v).__name__ for v in a], a[1])\nFINAL(a)")
    outcomes = iter(["FINAL(\"['s1', 's2']\")", "FINAL('P2 says hi')", "print(paper_id)"])

    class PerChild(Canned):
        def __call__(self, conversations: Sequence[Conversation],
                     max_new_tokens: int) -> list[str]:
            if conversations[0][0]["content"] == CHILD_SYSTEM_PROMPT:
                return [block(next(outcomes)) if len(c) == 2 else "no block"
                        for c in conversations]
            return super().__call__(conversations, max_new_tokens)

    (tree,) = run_trees([e], PerChild([root]), replace(CFG, max_child_turns=2), chars)
    assert tree.final == [["s1", "s2"], "P2 says hi", None]
    assert [(c.paper_id, c.turns, c.finish, c.has_final) for c in tree.children] == [
        ("P1", 1, "final", True), ("P2", 1, "final", True), ("(given text)", 2, "max_turns",
                                                             False)]
    child_observation = [s for s in tree.segments if s.child == 2][1].prompt[-1]["content"]
    assert child_observation == "(given text)\n"


def test_missing_blocks_and_the_turn_limit(examples: list) -> None:
    policy = Canned(["I think the answer is P1."])
    (tree,) = run_trees(examples[:1], policy, replace(CFG, max_root_turns=3), chars)
    assert (tree.finish, tree.has_final, tree.final, tree.root_turns) == (
        "max_turns", False, None, 3)
    assert [s.prompt[-1]["content"] for s in tree.segments[1:]] == [NO_BLOCK, NO_BLOCK]
    assert tree.repl_blocks == 0 and len(policy.seen) == 3


def test_only_the_first_block_runs(examples: list) -> None:
    text = block("print('first')") + "\n```repl\nprint('second')\n```"
    (tree,) = run_trees(examples[:1], Canned([text]), replace(CFG, max_root_turns=2), chars)
    assert tree.segments[1].prompt[-1]["content"] == "first\n"


def test_context_limit_ends_the_root_without_an_answer(examples: list) -> None:
    policy = Canned([block("print('x' * 3000)")])

    def count(conversation: Conversation) -> int:
        """Over the limit of 100 once the conversation holds more than the first prompt."""
        return 101 if len(conversation) > 2 else 0

    (tree,) = run_trees(examples[:1], policy, replace(CFG, max_prompt_tokens=100), count)
    assert (tree.finish, tree.has_final, tree.root_turns) == ("context_limit", False, 1)


def test_a_timeout_in_a_tree_resets_its_session_and_the_tree_goes_on(examples: list) -> None:
    policy = Canned([block("x = 1"), block("while True:\n    pass"),
                     block("print('x' in dir())"), block("FINAL('after')")])
    (tree,) = run_trees(examples[:1], policy, replace(CFG, repl_timeout=1.0), chars)
    assert (tree.repl_timeouts, tree.final, tree.finish) == (1, "after", "final")
    assert "session was reset" in tree.segments[2].prompt[-1]["content"]
    assert tree.segments[3].prompt[-1]["content"] == "False\n"


def test_generate_must_return_one_text_per_conversation(examples: list) -> None:
    with pytest.raises(ValueError, match="generate returned 0 texts for 1"):
        run_trees(examples[:1], lambda conversations, n: [], CFG, chars)


def _tree(segments: list[tuple[int | None, int]], children: int, final: object,
          finish: str, blocks: int, errors: int, timeouts: int, refusals: int) -> TreeRecord:
    segs = tuple(Segment(c, t, (), "x") for c, t in segments)
    kids = tuple(ChildRecord(j, "q", "P1", None, False, 1, "max_turns") for j in range(children))
    root_turns = sum(c is None for c, _ in segments)
    return TreeRecord("ex", segs, final is not None, final, finish,  # type: ignore[arg-type]
                      root_turns, kids, blocks, errors, timeouts, refusals)


def test_tree_metrics_by_hand() -> None:
    a = _tree([(None, 0), (0, 0), (1, 0), (None, 1)], 2, ["s"], "final", 4, 1, 1, 0)
    b = _tree([(None, 0), (None, 1), (None, 2)], 0, None, "context_limit", 2, 1, 0, 3)
    scores = [TreeScore(0.5, 1.0, 1 / 3, 1), TreeScore(0.0, 0.0, 0.0, 0)]
    assert tree_metrics([a, b], scores) == {
        "reward/mean": 0.25, "reward/max": 0.5, "reward/precision": 0.5,
        "reward/recall": pytest.approx(1 / 6),
        "rlm/children_mean": 1.0,            # (2 + 0) / 2
        "rlm/segments": 7.0, "rlm/root_segments": 5.0, "rlm/child_segments": 2.0,
        "rlm/root_turns_mean": 2.5,          # (2 + 3) / 2
        "rlm/final_rate": 0.5,
        "rlm/repl_error_rate": 2 / 6,        # (1 + 1) errors over (4 + 2) blocks
        "rlm/repl_timeouts": 1.0, "rlm/budget_refusals": 3.0,
        "rlm/context_limit_rate": 0.5, "rlm/n_pred_mean": 0.5}
    with pytest.raises(ValueError, match="one score per tree"):
        tree_metrics([a], scores)


def test_score_tree_in_both_modes(examples: list) -> None:
    e = examples[0]
    answered = _tree([(None, 0)], 0, [g.text for g in e.gold], "final", 1, 0, 0, 0)
    silent = _tree([(None, 0)], 0, None, "max_turns", 1, 0, 0, 0)
    assert score_tree(answered, e, CFG) == TreeScore(1.0, 1.0, 1.0, len(e.gold))
    assert score_tree(silent, e, CFG) == TreeScore(0.0, 0.0, 0.0, 0)
    judge_cfg = replace(CFG, reward_mode="judge")
    asked: list[object] = []

    def judge(answer: object, gold: object, cfg: RlmConfig) -> tuple[int, int]:
        asked.append(answer)
        return 8, 4

    # (8/10 + 4/10) / 2 = 0.6
    assert score_tree(answered, e, judge_cfg, judge) == TreeScore(
        pytest.approx(0.6), 0.8, 0.4, len(e.gold))  # type: ignore[arg-type]
    assert score_tree(silent, e, judge_cfg, judge) == TreeScore(0.0, 0.0, 0.0, 0)
    assert asked == [answered.final]  # no answer: the judge is not asked
