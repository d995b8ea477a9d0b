"""Checkpoint-reward token tasks beyond reversal (TASKS.md, "Toy tasks").

Prompts are those of the reversal family: ``seq_len`` = H content tokens from {0..V−1}, then
SEP (id V); the policy emits H tokens. Only the targets and the checkpoints of the reward
differ. Each reward is ([checkpoint 1 exact] + [checkpoint 2 exact] + [whole exact]) / 3:

- ``chain_arithmetic``: targets copy inputs 0..H−2; the last target is (Σ of the first H−1
  inputs) mod V. Checkpoints: the copied prefix, the answer. V + 1 symbols.
- ``format_answer``: target[0] = ANSWER (id V+1), target[1] = (x0 + x1) mod V,
  target[2:] = input[2:]. Checkpoints: the format tag, the answer. V + 2 symbols.

Both expose dense per-token rewards (the per-position match), carry ground-truth targets, and
do not expose the exact expected reward (a checkpoint past the first depends on the sampled
prefix, which one teacher-forced pass cannot marginalise).
"""

from __future__ import annotations

import dataclasses

import torch

from rlscope.batch import PromptBatch, RolloutBatch
from rlscope.tasks.base import EVAL_OPTIONS, NOISE_OPTIONS, TaskConfig
from rlscope.tasks.reversal import ReversalTask


def checkpoint_reward(match_BT: torch.Tensor, first: slice, second: slice) -> torch.Tensor:
    """([match on ``first`` exact] + [match on ``second`` exact] + [all exact]) / 3, ``[B]``.

    ``match_BT`` is the 0/1 per-position match with the targets.
    """
    parts_3B = torch.stack([match_BT[:, first].min(-1).values,
                            match_BT[:, second].min(-1).values,
                            match_BT.min(-1).values])
    return parts_3B.mean(0)


def _checkpoint_errors(name: str, cfg: TaskConfig) -> list[str]:
    errors = []
    if cfg.seq_len < 2:
        errors.append(f"{name} needs task.seq_len >= 2 (two checkpoints); got "
                      f"--seq_len {cfg.seq_len}")
    if cfg.binary_reward:
        errors.append(f"{name} has its own checkpoint reward; drop task.binary_reward "
                      "(--no_binary_reward)")
    return errors


def _checkpoint_metrics(match_BT: torch.Tensor, rewards_B: torch.Tensor
                        ) -> dict[str, torch.Tensor]:
    return {"test_error": 1.0 - match_BT.min(-1).values, "chain_reward": rewards_B}


class ChainArithmeticTask(ReversalTask):
    """Copy the first H−1 tokens, then answer their sum mod V; checkpoint reward."""

    name = "chain_arithmetic"
    dense_credit = False
    options: tuple[str, ...] = ("vocab", "seq_len", *EVAL_OPTIONS, *NOISE_OPTIONS)

    def validate(self) -> list[str]:
        return super().validate() + _checkpoint_errors(self.name, self.cfg)

    def describe(self) -> str:
        H, V = self.cfg.seq_len, self.cfg.vocab
        return (f"{self.name}: copy the first {H - 1} of {H} tokens, then their sum mod {V} "
                f"(alphabet {V}, SEP = {self.sep})")

    def sample_prompts(self, generator: torch.Generator, n: int) -> PromptBatch:
        prompts = super().sample_prompts(generator, n)
        prefix_BL = prompts.tokens_BP[:, :self.cfg.seq_len - 1]
        answer_B1 = prefix_BL.sum(-1, keepdim=True) % self.cfg.vocab
        return dataclasses.replace(prompts, targets_BT=torch.cat([prefix_BL, answer_B1], 1))

    def _rewards(self, match_BT: torch.Tensor) -> torch.Tensor:
        H = self.cfg.seq_len
        return checkpoint_reward(match_BT, slice(0, H - 1), slice(H - 1, H))

    def eval_metrics(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        match_BT = self._matches(batch)
        return _checkpoint_metrics(match_BT, self._rewards(match_BT))


class FormatAnswerTask(ReversalTask):
    """Emit an ANSWER tag, then (x0 + x1) mod V, then copy inputs 2..H−1; checkpoint reward."""

    name = "format_answer"
    dense_credit = False
    options: tuple[str, ...] = ("vocab", "seq_len", *EVAL_OPTIONS, *NOISE_OPTIONS)

    def __init__(self, cfg: TaskConfig) -> None:
        super().__init__(cfg)
        self.answer = cfg.vocab + 1
        self.vocab_size = cfg.vocab + 2

    def validate(self) -> list[str]:
        return super().validate() + _checkpoint_errors(self.name, self.cfg)

    def describe(self) -> str:
        H, V = self.cfg.seq_len, self.cfg.vocab
        return (f"{self.name}: ANSWER tag (id {self.answer}), (x0 + x1) mod {V}, then copy "
                f"inputs 2..{H - 1} (alphabet {V}, SEP = {self.sep})")

    def sample_prompts(self, generator: torch.Generator, n: int) -> PromptBatch:
        prompts = super().sample_prompts(generator, n)
        content_BL = prompts.tokens_BP[:, :self.cfg.seq_len]
        tag_B1 = torch.full((n, 1), self.answer, dtype=content_BL.dtype)
        answer_B1 = (content_BL[:, 0:1] + content_BL[:, 1:2]) % self.cfg.vocab
        targets_BT = torch.cat([tag_B1, answer_B1, content_BL[:, 2:]], 1)
        return dataclasses.replace(prompts, targets_BT=targets_BT)

    def _rewards(self, match_BT: torch.Tensor) -> torch.Tensor:
        return checkpoint_reward(match_BT, slice(0, 1), slice(1, 2))

    def eval_metrics(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        match_BT = self._matches(batch)
        return _checkpoint_metrics(match_BT, self._rewards(match_BT))
