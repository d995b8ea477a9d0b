"""The reversal family of sandbox token tasks (TASKS.md, "Toy tasks").

A prompt is ``seq_len`` content tokens from {0..V−1} followed by SEP (id V); the target is the
content reversed. The policy emits ``seq_len`` tokens over V + 1 symbols (SEP is legal but never
correct). Variants differ only in how a completion is scored:

- ``token_reversal``: mean per-position match (``binary_reward``: exact match of all).
- ``masked_reversal``: only the last ``score_len`` positions are scored (binary: suffix exact).
- ``chain_reversal``: ([first half exact] + [second half exact] + [whole exact]) / 3, split at
  ``seq_len // 2``.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from rlscope.batch import PromptBatch, RolloutBatch
from rlscope.tasks.base import EVAL_OPTIONS, NOISE_OPTIONS, Scores, TaskConfig, TaskTraits

EVAL_SEED_OFFSET = 1_000_003


class ReversalTask:
    """Reverse the prompt; reward = fraction of positions right (binary: exact match).

    Also the shared machinery of the family: variants override `_score_mask`, `_rewards` and
    `eval_metrics` only.
    """

    name = "token_reversal"
    family = "sequence"
    dense_credit: ClassVar[bool] = True
    """The reward is the mean of per-position matches (dense credit is exact); False in the
    checkpoint-reward variants."""
    options: tuple[str, ...] = ("vocab", "seq_len", "binary_reward", *EVAL_OPTIONS, *NOISE_OPTIONS)
    has_labels = True

    def __init__(self, cfg: TaskConfig) -> None:
        self.cfg = cfg
        self.sep = cfg.vocab
        self.vocab_size = cfg.vocab + 1
        self.prompt_len = cfg.seq_len + 1
        self.completion_len = cfg.seq_len
        self.score_mask_T = self._score_mask()

    def _score_mask(self) -> torch.Tensor:
        return torch.ones(self.cfg.seq_len)

    @property
    def traits(self) -> TaskTraits:
        return TaskTraits(binary_rewards=self.cfg.binary_reward,
                          decomposable_token_rewards=self.dense_credit)

    def validate(self) -> list[str]:
        errors = []
        if self.cfg.vocab < 2:
            errors.append(f"task.vocab={self.cfg.vocab} must be >= 2")
        if self.cfg.seq_len < 1:
            errors.append(f"task.seq_len={self.cfg.seq_len} must be >= 1")
        if self.cfg.eval_batches < 1 or self.cfg.eval_batch_size < 1:
            errors.append("task.eval_batches and task.eval_batch_size must be >= 1")
        return errors

    def describe(self) -> str:
        return (f"{self.name}: reverse {self.cfg.seq_len} tokens over an alphabet of "
                f"{self.cfg.vocab} (SEP = {self.sep})")

    def sample_prompts(self, generator: torch.Generator, n: int) -> PromptBatch:
        content_BL = torch.randint(0, self.cfg.vocab, (n, self.cfg.seq_len), generator=generator)
        sep_B1 = torch.full((n, 1), self.sep, dtype=torch.long)
        return PromptBatch(
            tokens_BP=torch.cat([content_BL, sep_B1], 1),
            targets_BT=content_BL.flip(1),
            score_mask_BT=self.score_mask_T.expand(n, -1),
        )

    def eval_prompts(self, seed: int) -> list[PromptBatch]:
        g = torch.Generator().manual_seed(seed + EVAL_SEED_OFFSET)
        return [self.sample_prompts(g, self.cfg.eval_batch_size)
                for _ in range(self.cfg.eval_batches)]

    def sft_pairs(self, generator: torch.Generator, n: int) -> list[tuple[list[int], list[int]]]:
        """``n`` supervised pairs ``(prompt ids, target ids)`` of fresh prompts (for
        `rlscope sft`); every position is supervised, scored or not."""
        prompts = self.sample_prompts(generator, n)
        assert prompts.targets_BT is not None
        return list(zip(prompts.tokens_BP.tolist(), prompts.targets_BT.tolist(), strict=True))

    def _matches(self, batch: RolloutBatch) -> torch.Tensor:
        if batch.targets_BT is None:
            raise ValueError(f"{self.name}: rollout batch carries no targets")
        T = batch.targets_BT.shape[1]
        completion_BT = batch.completion_tokens_BT[:, :T]
        # padding after a stop token was never generated: it cannot match
        completion_BT = torch.where(batch.completion_mask_BT[:, :T].bool(), completion_BT, -1)
        if completion_BT.shape[1] < T:
            pad = torch.full((completion_BT.shape[0], T - completion_BT.shape[1]), -1,
                             dtype=completion_BT.dtype, device=completion_BT.device)
            completion_BT = torch.cat([completion_BT, pad], 1)
        return (completion_BT == batch.targets_BT).float()

    def _rewards(self, match_BT: torch.Tensor) -> torch.Tensor:
        if self.cfg.binary_reward:
            return match_BT.min(-1).values
        return match_BT.mean(-1)

    def score(self, batch: RolloutBatch) -> Scores:
        match_BT = self._matches(batch)
        mask_T = self.score_mask_T.to(match_BT.device)
        return Scores(rewards_B=self._rewards(match_BT), token_rewards_BT=match_BT * mask_T)

    def expected_reward(self, logp_targets_BT: torch.Tensor) -> torch.Tensor | None:
        """Binary reward only: P(exact match) = Π_t π(y_t | y_<t) over scored positions."""
        if not self.cfg.binary_reward:
            return None
        mask_T = self.score_mask_T.to(logp_targets_BT.device)
        return (logp_targets_BT * mask_T).sum(-1).exp()

    def eval_metrics(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        match_BT = self._matches(batch)
        if self.cfg.binary_reward:
            return {"test_error": 1.0 - match_BT.min(-1).values}
        return {"test_error": 1.0 - match_BT.mean(-1)}


class MaskedReversalTask(ReversalTask):
    """Reversal scored on the last score_len output positions only."""

    name = "masked_reversal"
    options: tuple[str, ...] = ("vocab", "seq_len", "score_len", "binary_reward",
                                *EVAL_OPTIONS, *NOISE_OPTIONS)

    def _score_mask(self) -> torch.Tensor:
        mask = torch.zeros(self.cfg.seq_len)
        mask[self.cfg.seq_len - self.cfg.score_len:] = 1.0
        return mask

    def validate(self) -> list[str]:
        errors = super().validate()
        if not 1 <= self.cfg.score_len <= self.cfg.seq_len:
            errors.append(f"task.score_len={self.cfg.score_len} must lie in "
                          f"[1, task.seq_len={self.cfg.seq_len}]")
        return errors

    def _rewards(self, match_BT: torch.Tensor) -> torch.Tensor:
        suffix_BS = match_BT[:, self.cfg.seq_len - self.cfg.score_len:]
        return suffix_BS.min(-1).values if self.cfg.binary_reward else suffix_BS.mean(-1)

    def eval_metrics(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        match_BT = self._matches(batch)
        split = self.cfg.seq_len - self.cfg.score_len
        suffix_BS, prefix_BU = match_BT[:, split:], match_BT[:, :split]
        if self.cfg.binary_reward:
            err_B = 1.0 - suffix_BS.min(-1).values
        else:
            err_B = 1.0 - suffix_BS.mean(-1)
        unscored_B = (1.0 - prefix_BU.mean(-1)) if split else torch.zeros_like(err_B)
        return {"test_error": err_B, "test_error_unscored": unscored_B}


class ChainReversalTask(ReversalTask):
    """Reversal with checkpoint rewards: first half, second half and whole exact, averaged."""

    name = "chain_reversal"
    dense_credit = False
    options: tuple[str, ...] = ("vocab", "seq_len", *EVAL_OPTIONS, *NOISE_OPTIONS)

    def validate(self) -> list[str]:
        errors = super().validate()
        if self.cfg.seq_len < 2:
            errors.append("chain_reversal needs task.seq_len >= 2 (two halves)")
        if self.cfg.binary_reward:
            errors.append("chain_reversal has its own checkpoint reward; drop "
                          "task.binary_reward")
        return errors

    def _rewards(self, match_BT: torch.Tensor) -> torch.Tensor:
        half = self.cfg.seq_len // 2
        first_B = match_BT[:, :half].min(-1).values
        second_B = match_BT[:, half:].min(-1).values
        whole_B = match_BT.min(-1).values
        return (first_B + second_B + whole_B) / 3.0

    def eval_metrics(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        match_BT = self._matches(batch)
        return {"test_error": 1.0 - match_BT.min(-1).values,
                "chain_reward": self._rewards(match_BT)}
