"""Scoring trees and their per-step statistics (COMPANIONS.md section 4, "Metrics per step"):
the environment's share of the metrics; the training step adds the loss, ratio, KL, advantage
and timing metrics."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rlscope.envs.rlm.config import RlmConfig
from rlscope.envs.rlm.data import RlmExample
from rlscope.envs.rlm.reward import char_f1, judge_grades, judge_score, parse_predictions
from rlscope.envs.rlm.tree import TreeRecord


@dataclass(frozen=True)
class TreeScore:
    """The reward of one tree and its parts (judge mode: the judge's grades / 10)."""

    reward: float
    precision: float
    recall: float
    n_pred: int


def score_tree(tree: TreeRecord, example: RlmExample, cfg: RlmConfig,
               judge: Callable[..., tuple[int, int]] = judge_grades) -> TreeScore:
    """The reward of ``tree``'s final answer under ``cfg.reward_mode`` (no answer scores 0
    in both modes without asking the judge). ``judge`` is injectable for tests."""
    n_pred = len(parse_predictions(tree.final)) if tree.has_final else 0
    if cfg.reward_mode == "judge":
        if not tree.has_final:
            return TreeScore(0.0, 0.0, 0.0, 0)
        p, r = judge(tree.final, example.gold, cfg)
        return TreeScore(judge_score(p, r), p / 10, r / 10, n_pred)
    score = char_f1(tree.final if tree.has_final else None, example.papers, example.gold,
                    cfg.max_reward_predictions)
    return TreeScore(score.reward, score.precision, score.recall, score.n_pred)


def tree_metrics(trees: Sequence[TreeRecord], scores: Sequence[TreeScore]) -> dict[str, float]:
    """The environment's metrics of one step's trees: ``reward/{mean, max, precision,
    recall}`` and ``rlm/{children_mean, segments, root_segments, child_segments,
    root_turns_mean, final_rate, repl_error_rate, repl_timeouts, budget_refusals,
    context_limit_rate, n_pred_mean}`` (segment counts and events summed over the trees,
    rates and means over trees; ``repl_error_rate`` over REPL blocks)."""
    if not trees or len(trees) != len(scores):
        raise ValueError(f"need one score per tree (got {len(trees)} trees, {len(scores)} "
                         "scores)")
    n = len(trees)
    blocks = sum(t.repl_blocks for t in trees)
    return {
        "reward/mean": sum(s.reward for s in scores) / n,
        "reward/max": max(s.reward for s in scores),
        "reward/precision": sum(s.precision for s in scores) / n,
        "reward/recall": sum(s.recall for s in scores) / n,
        "rlm/children_mean": sum(len(t.children) for t in trees) / n,
        "rlm/segments": float(sum(len(t.segments) for t in trees)),
        "rlm/root_segments": float(sum(t.root_segments for t in trees)),
        "rlm/child_segments": float(sum(t.child_segments for t in trees)),
        "rlm/root_turns_mean": sum(t.root_turns for t in trees) / n,
        "rlm/final_rate": sum(t.has_final for t in trees) / n,
        "rlm/repl_error_rate": sum(t.repl_errors for t in trees) / blocks if blocks else 0.0,
        "rlm/repl_timeouts": float(sum(t.repl_timeouts for t in trees)),
        "rlm/budget_refusals": float(sum(t.budget_refusals for t in trees)),
        "rlm/context_limit_rate": sum(t.finish == "context_limit" for t in trees) / n,
        "rlm/n_pred_mean": sum(s.n_pred for s in scores) / n,
    }
