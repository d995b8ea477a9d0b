"""The ``rlm_papers`` environment of ``rlm_grpo`` (COMPANIONS.md section 4; docs/companions.md,
"RLM"): the examples (`data`), the REPL tools (`tools`), the prompts (`prompts`), the rewards
(`reward`), the tree driver and its credit weights (`tree`), scoring and per-step statistics
(`stats`), the scripted warm start (`scripted`) and the options (`config`). Pure Python over
text: the policy is a ``generate(conversations, max_new_tokens)`` callable, so nothing here
imports a model."""

from rlscope.envs.rlm.config import RlmConfig, rlm_errors, sandbox_errors
from rlscope.envs.rlm.data import (
    GoldSpan,
    RlmExample,
    check_prompt_lengths,
    load_examples,
    split_examples,
)
from rlscope.envs.rlm.reward import CharF1, JudgeError, char_f1, judge_reward
from rlscope.envs.rlm.scripted import ScriptedPolicy, sft_pairs
from rlscope.envs.rlm.stats import TreeScore, score_tree, tree_metrics
from rlscope.envs.rlm.tree import (
    ChildRecord,
    Segment,
    TreeRecord,
    credit_weights,
    run_trees,
    segment_weights,
)

__all__ = ["CharF1", "ChildRecord", "GoldSpan", "JudgeError", "RlmConfig", "RlmExample",
           "ScriptedPolicy", "Segment", "TreeRecord", "TreeScore", "char_f1",
           "check_prompt_lengths", "credit_weights", "judge_reward", "load_examples",
           "rlm_errors", "run_trees", "sandbox_errors", "score_tree", "segment_weights",
           "sft_pairs", "split_examples", "tree_metrics"]
