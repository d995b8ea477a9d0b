"""The `Task` protocol (TASKS.md) and the configuration every task reads.

A task makes prompts, scores completions and evaluates a policy; the loop holds no task-specific
code. Training rewards may later be corrupted by reward noise; evaluation is always clean and on
a held-out set fixed per seed, drawn from a generator the training stream never touches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from rlscope.batch import PromptBatch, RolloutBatch
from rlscope.policy.base import Policy

EVAL_OPTIONS = ("eval_batches", "eval_batch_size")
NOISE_OPTIONS = ("reward_noise", "reward_noise_mode")


@dataclass(frozen=True)
class TaskConfig:
    """Task options (each task reads the fields that apply to it)."""

    vocab: int = 2
    """Content alphabet size V of the token tasks (the policy sees V + 1 symbols, SEP = V;
    format_answer adds the ANSWER tag, id V + 1)."""
    seq_len: int = 10
    """Content tokens per prompt; also the completion length of the token tasks."""
    binary_reward: bool = False
    """Reward 1 only on an exact match (token_reversal, masked_reversal)."""
    score_len: int = 5
    """masked_reversal: how many final output positions are scored."""
    eval_batches: int = 10
    """Held-out evaluation: number of batches."""
    eval_batch_size: int = 100
    """Held-out evaluation: prompts per batch."""
    reward_noise: float = 0.0
    """Probability in [0, 1] that a training sample's reward is corrupted (evaluation is always
    clean); needs a reward_noise_mode other than none."""
    reward_noise_mode: str = "none"
    """How a corrupted training reward changes: none, label_flip, random_reward,
    false_positive_action0, spurious_feature, false_positive_rare_token (docs/tasks.md)."""
    context_len: int = 32
    """lm_bandit: bytes of corpus text in each prompt (the action predicts the next byte)."""
    lm_kl_shaping: float = 0.0
    """lm_bandit: β of the KL-shaped training reward r − β(log π(a) − log π_ref(a)), π_ref the
    frozen initial policy (0 = plain reward; not combinable with reward_noise)."""
    difficulty: int = 1
    """arithmetic: 1 = a+b with operands 0..99; 2 = a+b or a−b with operands 10..999;
    3 = three or four operands 0..99 joined by + or − (docs/tasks.md)."""
    format_reward: float = 0.0
    """arithmetic: reward in [0, 1) for a well-formed but wrong answer (a terminated integer in
    canonical form); 0 = binary reward."""
    length_limit: int = 64
    """length_target, preference_rm: most tokens (bytes, stop included) a completion may
    have."""
    band_min_words: int = 0
    """length_target: with band_max_words > 0, the least words of a rewarded answer."""
    band_max_words: int = 0
    """length_target: reward 1 inside [band_min_words, band_max_words] words, else 0;
    0 = the default reward 2 − words/16 (shorter is better)."""
    rm_path: str = ""
    """preference_rm: the reward model to train against (the output directory of
    `rlscope rm`, or its rm.pt); required by rlscope train on that task."""
    code_completion_len: int = 256
    """code_unit_tests: most tokens generated for a function body (the END stop token
    included)."""
    code_workers: int = 2
    """code_unit_tests: sandboxes run at a time when a batch is scored (each takes up to one
    CPU core)."""
    code_cpu_seconds: int = 2
    """code_unit_tests: CPU seconds of one sandboxed program (RLIMIT_CPU) before it is killed
    (reward 0)."""
    code_wall_seconds: float = 5.0
    """code_unit_tests: wall-clock seconds of one sandboxed program before the trainer kills it
    (reward 0); keep it above code_cpu_seconds plus interpreter start-up."""
    code_per_test_seconds: float = 1.0
    """code_unit_tests: alarm per hidden test call inside the sandbox (a slow test fails
    alone)."""
    unsafe_sandbox: bool = False
    """code_unit_tests: run generated code in the WEAK sandbox (a plain subprocess with an
    in-process audit hook, escapable by a determined program) instead of refusing to start
    where bubblewrap (apt-get install bubblewrap) or seccomp is unavailable; docs/sandbox.md."""


@dataclass(frozen=True)
class Scores:
    """What `Task.score` returns: scalar rewards and, where defined, dense per-token rewards."""

    rewards_B: torch.Tensor
    token_rewards_BT: torch.Tensor | None = None
    unshaped_rewards_B: torch.Tensor | None = None
    """The task's reward before any shaping it applies (None when it applies none)."""


def first_token_correct(batch: RolloutBatch, task_name: str) -> torch.Tensor:
    """``[B]`` float for one-action tasks: the first completion token counts and equals the
    target."""
    if batch.targets_BT is None:
        raise ValueError(f"{task_name}: rollout batch carries no targets")
    return ((batch.completion_tokens_BT[:, 0] == batch.targets_BT[:, 0])
            & batch.completion_mask_BT[:, 0].bool()).float()


class Task(Protocol):
    """A registered task. Attributes describe the interface the loop relies on.

    Optional methods, looked up with ``getattr``: ``build_policy`` / ``attach_policy`` (a
    task's own model), ``sft_pairs`` (warm-start data for ``rlscope sft``),
    ``preference_pairs`` (comparisons for ``rlscope rm``) and ``validate_training`` (problems
    that stop ``rlscope train`` only, e.g. ``preference_rm`` without ``--rm_path``)."""

    name: str
    family: str
    """"sequence" (token tasks) or "bandit" (one action): decides which reward-noise modes
    exist for the task."""
    vocab_size: int
    """Token ids the policy reads and writes."""
    prompt_len: int
    completion_len: int
    """Default number of generated tokens."""
    options: tuple[str, ...]
    """The `TaskConfig` fields (command-line options) the task reads."""
    has_labels: bool
    """Whether prompts carry ground-truth targets (needed by the `ce` oracle)."""

    def sample_prompts(self, generator: torch.Generator, n: int) -> PromptBatch: ...

    def score(self, batch: RolloutBatch) -> Scores: ...

    def expected_reward(self, logp_targets_BT: torch.Tensor) -> torch.Tensor | None:
        """Exact E[r | x] from the behaviour log-probs of the targets, or None if not exposed."""
        ...

    def eval_prompts(self, seed: int) -> list[PromptBatch]: ...

    def eval_metrics(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        """Per-row evaluation quantities of a greedy rollout, each ``[B]`` (averaged later)."""
        ...

    def describe(self) -> str: ...

    def validate(self) -> list[str]: ...


def make_policy_for(task: Task, model_cfg: object) -> Policy:
    """The task's default policy: the task's own ``build_policy(model_cfg)`` where it defines
    one (digits_bandit's MLP), else the configured sequence model over the task's vocabulary
    and its prompt + completion length."""
    from rlscope.policy import ModelConfig, build_policy

    own = getattr(task, "build_policy", None)
    if own is not None:
        return own(model_cfg)
    assert isinstance(model_cfg, ModelConfig)
    return build_policy(model_cfg, task.vocab_size, task.prompt_len + task.completion_len)
