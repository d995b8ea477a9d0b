"""`RlmTrainConfig`: the ``rlm_grpo`` trainer's own options beside `RlmConfig` (COMPANIONS.md
section 4): how root rewards become advantages, how a local model is prompted and loaded, and
how much of the eval split an evaluation reads. The ``tree`` step (`rlscope.steps.tree`)
reads them and checks them with the method."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RlmTrainConfig:
    """rlm_grpo's trainer options (the tree step)."""

    scale_rewards: bool = True
    """Divide each group's centred root rewards by their std (group z-score, A_i = (R_i −
    mean)/(std + 1e-8)); ``--no_scale_rewards``: centre only (A_i = R_i − mean). Either way a
    group whose rewards have std ≤ 1e-8 gets A = 0."""
    enable_thinking: bool = False
    """--arch hf: pass enable_thinking=True to the model's chat template (templates that read
    it, e.g. Qwen3, then let the model think before answering). Refused for a model built from
    a config (its byte chat format has no thinking mode)."""
    load_in_4bit: bool = False
    """--arch hf on CUDA with LoRA: load the frozen base in 4-bit NF4 with double quantisation
    (bitsandbytes); the adapters train in full precision."""
    eval_examples: int = 0
    """Trees per evaluation: the first this many examples of the eval split, one greedy tree
    each (0 = the whole split)."""
