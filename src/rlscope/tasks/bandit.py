"""``digits_bandit``: a contextual bandit on scikit-learn's handwritten digits (TASKS.md,
"Toy tasks").

The prompt is an 8×8 digit from `sklearn.datasets.load_digits` as 64 integer tokens, its pixel
values 0..16 (the policy's features are ``token / 16`` in [0, 1]); the completion is one token,
the action 0..9; the reward is 1 if the action is the digit's label. The policy is
`rlscope.policy.mlp.MLPPolicy` (64 → 50 → 50 → 10, ReLU), built through the task's
`build_policy` hook, so the generic sampler and learner treat the bandit as a one-token
completion.

The train/test split is fixed once for every run (``train_test_split(test_size=0.25,
random_state=0)``: 1347 training and 450 test images, no image in both), whatever the run seed:
the seed changes the model's initialisation and the stream of training draws, never which
images are held out. Training prompts are drawn from the training split with replacement;
evaluation is greedy on the whole test split. The exact expected reward π(label | x) is exposed
while training rewards are clean.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from rlscope.batch import PromptBatch, RolloutBatch
from rlscope.policy.base import Policy
from rlscope.policy.mlp import MLPConfig, MLPPolicy
from rlscope.tasks.base import (
    EVAL_OPTIONS,
    NOISE_OPTIONS,
    Scores,
    TaskConfig,
    TaskTraits,
    first_token_correct,
    refuse_transformer_options,
    unused_option_errors,
)
from rlscope.tasks.noise import exposes_expected_reward

N_PIXELS = 64
MAX_LEVEL = 16
N_CLASSES = 10
TEST_SIZE = 0.25
SPLIT_SEED = 0


@dataclass(frozen=True)
class DigitsSplit:
    """The fixed split: pixel tokens ``[N, 64]`` (long, 0..16) and labels ``[N]`` (long)."""

    train_tokens_NP: torch.Tensor
    train_labels_N: torch.Tensor
    test_tokens_MP: torch.Tensor
    test_labels_M: torch.Tensor


@functools.lru_cache(maxsize=1)
def load_split() -> DigitsSplit:
    """`load_digits` split by ``train_test_split(test_size=0.25, random_state=0)`` (bundled
    with scikit-learn: no download)."""
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError as error:
        raise ImportError("digits_bandit needs scikit-learn: pip install scikit-learn") \
            from error
    digits = load_digits()
    x_tr, x_te, y_tr, y_te = train_test_split(digits.data, digits.target, test_size=TEST_SIZE,
                                              random_state=SPLIT_SEED)
    return DigitsSplit(
        train_tokens_NP=torch.as_tensor(x_tr).round().long(),
        train_labels_N=torch.as_tensor(y_tr).long(),
        test_tokens_MP=torch.as_tensor(x_te).round().long(),
        test_labels_M=torch.as_tensor(y_te).long(),
    )


class DigitsBanditTask:
    """Classify a handwritten digit in one action; reward 1 if the action is the label."""

    name = "digits_bandit"
    family = "bandit"
    traits = TaskTraits(binary_rewards=True)
    options: tuple[str, ...] = NOISE_OPTIONS
    """Reward-noise family (`rlscope.tasks.noise`)."""
    has_labels = True
    vocab_size = MAX_LEVEL + 1
    """Prompt token ids 0..16; actions (completion tokens) are 0..9, the MLP's output width."""
    prompt_len = N_PIXELS
    completion_len = 1

    def __init__(self, cfg: TaskConfig) -> None:
        self.cfg = cfg
        self.data = load_split()

    def validate(self) -> list[str]:
        """Options of the token tasks have no meaning here (reward noise is checked by the
        config for the bandit family)."""
        errors = unused_option_errors(self.cfg, self.name, ("vocab", "seq_len", "score_len",
                                                            "binary_reward"),
                                      " (its prompts are fixed 8×8 digits and its completion "
                                      "one action)")
        errors += unused_option_errors(self.cfg, self.name, EVAL_OPTIONS,
                                       ": evaluation covers the whole fixed test split "
                                       f"({self.data.test_labels_M.shape[0]} images)")
        return errors

    def describe(self) -> str:
        return (f"{self.name}: classify scikit-learn's 8×8 digits in one action of "
                f"{N_CLASSES} (reward 1 if right); {self.data.train_labels_N.shape[0]} training "
                f"/ {self.data.test_labels_M.shape[0]} test images, split random_state="
                f"{SPLIT_SEED}; policy MLP 64 → 50 → 50 → 10")

    def build_policy(self, model_cfg: object) -> Policy:
        """The task's own model, an `MLPPolicy` (the transformer options do not apply)."""
        model_cfg = refuse_transformer_options(model_cfg, self.name, "MLP 64 → 50 → 50 → 10")
        cfg = MLPConfig(n_inputs=N_PIXELS, max_level=MAX_LEVEL, hidden=(50, 50),
                        n_actions=N_CLASSES)
        return MLPPolicy(cfg).to(getattr(torch, model_cfg.dtype))

    def _prompts(self, tokens_BP: torch.Tensor, labels_B: torch.Tensor) -> PromptBatch:
        return PromptBatch(tokens_BP=tokens_BP, targets_BT=labels_B[:, None],
                           score_mask_BT=torch.ones(labels_B.shape[0], 1))

    def sample_prompts(self, generator: torch.Generator, n: int) -> PromptBatch:
        """``n`` training images drawn uniformly with replacement."""
        index_B = torch.randint(0, self.data.train_labels_N.shape[0], (n,), generator=generator)
        return self._prompts(self.data.train_tokens_NP[index_B],
                             self.data.train_labels_N[index_B])

    def eval_prompts(self, seed: int) -> list[PromptBatch]:
        """The whole test split in its fixed order, one batch (the same for every seed)."""
        return [self._prompts(self.data.test_tokens_MP, self.data.test_labels_M)]

    def score(self, batch: RolloutBatch) -> Scores:
        correct_B = first_token_correct(batch, self.name)
        return Scores(rewards_B=correct_B, token_rewards_BT=correct_B[:, None])

    def expected_reward(self, logp_targets_BT: torch.Tensor) -> torch.Tensor | None:
        """π(label | x) = exp(log π(label | x)), ``[B]``, exact; None under reward noise."""
        if not exposes_expected_reward(self.cfg):
            return None
        return logp_targets_BT[:, 0].exp()

    def eval_metrics(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        """``test_error`` per row: 1 − [greedy action = label]."""
        return {"test_error": 1.0 - first_token_correct(batch, self.name)}
