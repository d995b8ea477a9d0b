"""``rlscope sft --task rlm_papers``: the scripted warm start of ``rlm_grpo`` (COMPANIONS.md §4,
an addition). A random model cannot emit the REPL protocol, so it first learns the scripted
transcripts of `rlscope.envs.rlm.sft_pairs` (per train example: the root's searches, one
``rlm_query`` and its ``FINAL`` of the gold sentences, and the child's transcript), with the
cross-entropy on the assistant turns only (`rlscope.steps.tree_model.transcript_ids`): system
prompts, questions and observations are context.

The model is the tree step's (`rlscope.steps.tree.rlm_policy`, same ``--arch`` / ``--path`` /
sizes / LoRA flags), so ``rlscope train --task rlm_papers --method rlm_grpo --init OUT`` loads
the output. A batch is ``--batch_size`` transcripts drawn with replacement, right-padded
(harmless in a causal model). Evaluation: ``sft/heldout_loss`` on the eval split's
transcripts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch

from rlscope.envs.rlm import RlmConfig, load_examples, sft_pairs, split_examples
from rlscope.steps.tree import TASK, chat_codec, positions, rlm_policy
from rlscope.steps.tree_model import transcript_ids
from rlscope.supervised.loop import run_job, torch_threads
from rlscope.supervised.sft import SftConfig, SftResult, save_sft, sft_loss
from rlscope.tasks import Task
from rlscope.utils import resolve_device

RLM_TASK = TASK
"""``rlscope sft --task rlm_papers`` runs `rlm_sft` instead of `rlscope.supervised.sft.sft`."""
HELDOUT_TRANSCRIPTS = 16
"""Eval-split transcripts in ``sft/heldout_loss``."""


def rlm_sft_errors(cfg: SftConfig) -> list[str]:
    """Every problem of an ``rlm_papers`` warm start (empty when it can run)."""
    from rlscope.checks import job_errors

    errors = job_errors(cfg) + cfg.model.validate()
    if cfg.data:
        errors.append("--data: rlm_papers trains on its scripted transcripts; drop --data")
    if cfg.model.arch not in ("llama", "qwen2", "hf"):
        errors.append(f"--arch {cfg.model.arch}: rlm_papers needs a Hugging Face model "
                      "(--arch qwen2 or llama built from a config, or --arch hf --path DIR)")
    if cfg.batch_size < 1 or cfg.lr <= 0:
        errors.append("--batch_size must be >= 1 and --lr > 0")
    return errors


def _batch(rows: Sequence[tuple[list[int], list[bool]]]
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(tokens_BL, targets_BL, mask_BL)``: right-padded transcripts, the next token at each
    position, and 1 where that next token is an assistant token."""
    L = max(len(ids) for ids, _ in rows)
    tokens_BL = torch.zeros(len(rows), L, dtype=torch.long)
    mask_BL = torch.zeros(len(rows), L)
    for i, (ids, mask) in enumerate(rows):
        tokens_BL[i, :len(ids)] = torch.tensor(ids)
        mask_BL[i, :len(ids) - 1] = torch.tensor(mask[1:], dtype=torch.float)
    targets_BL = torch.cat([tokens_BL[:, 1:], torch.zeros(len(rows), 1, dtype=torch.long)], 1)
    return tokens_BL, targets_BL, mask_BL


class _Described:
    """What `run_job` reads of a task (its description for ``config.json``)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def describe(self) -> str:
        return self.text


def rlm_sft(cfg: SftConfig) -> SftResult:
    """Run the warm start (module docstring) and write its output directory (``sft.pt``
    and, with LoRA, the adapter)."""
    errors = rlm_sft_errors(cfg)
    if errors:
        raise ValueError("invalid configuration:\n  - " + "\n  - ".join(errors))
    rlm = RlmConfig()
    train, heldout_examples = split_examples(load_examples())
    device = resolve_device(cfg.device)
    with torch_threads(cfg.threads):
        torch.manual_seed(cfg.seed)
        codec = chat_codec(cfg.model, False)
        policy = rlm_policy(cfg.model, codec, positions(rlm), device)
        data = [transcript_ids(codec, conversation, mask)
                for conversation, mask in sft_pairs(train, rlm.max_observation_chars)]
        heldout = [transcript_ids(codec, conversation, mask) for conversation, mask in
                   sft_pairs(heldout_examples, rlm.max_observation_chars)][:HELDOUT_TRANSCRIPTS]
        params = [p for p in policy.parameters() if p.requires_grad]  # type: ignore[attr-defined]
        optimizer = torch.optim.Adam(params, lr=cfg.lr)
        generator = torch.Generator().manual_seed(cfg.seed)

        def batch_loss(rows: Sequence[tuple[list[int], list[bool]]]) -> torch.Tensor:
            tokens_BL, targets_BL, mask_BL = (x.to(device) for x in _batch(rows))
            return sft_loss(policy(tokens_BL)[0], targets_BL, mask_BL)[0]  # type: ignore[operator]

        def step(_: int) -> dict[str, float]:
            index = torch.randint(0, len(data), (cfg.batch_size,), generator=generator)
            loss = batch_loss([data[i] for i in index.tolist()])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            return {"sft/loss": float(loss.detach())}

        def evaluate_now() -> dict[str, float]:
            with torch.no_grad():
                return {"sft/heldout_loss": float(batch_loss(heldout))}

        task = cast(Task, _Described(f"{TASK}: scripted transcripts of {len(train)} train "
                                     "examples (assistant turns trained)"))
        return run_job("sft", cfg, task, device, step, evaluate_now,
                       lambda out_dir, _: save_sft(out_dir, policy, cfg))  # type: ignore[arg-type]


__all__ = ["RLM_TASK", "rlm_sft", "rlm_sft_errors"]
