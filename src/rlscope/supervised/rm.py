"""``rlscope rm``: train a reward model on the preference pairs a task generates.

Each step draws ``batch_size`` fresh pairs (``task.preference_pairs``), scores chosen and
rejected sequences in one forward pass (`rlscope.policy.reward_model.pack_sequences`) and
takes an Adam step on the Bradley–Terry loss. Every ``eval_every`` steps and at the end it
reports, on ``heldout_pairs`` pairs from a generator the training stream never touches (seed +
`HELDOUT_SEED_OFFSET`): ``rm/heldout_loss``, ``rm/heldout_accuracy`` (share of pairs ranked
as the hidden preference ranks them) and ``rm/probe_accuracy`` on
pairs outside the training distribution (``task.repeat_probe_pairs``). At the end it stores
the mean and std of its raw scores over the held-out answers (both sides of each pair) for
standardisation and writes ``rm.pt`` (`rlscope.policy.reward_model.save_reward_model`),
``config.json`` and ``metrics.jsonl`` to the output directory. ``--init`` starts the backbone
from a policy checkpoint (an `rlscope sft` output), as InstructGPT initialises its RM from the
SFT model (Ouyang et al. arXiv:2203.02155).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from rlscope import checkpoint
from rlscope.policy.reward_model import (
    RewardModel,
    bradley_terry_loss,
    build_reward_model,
    pack_sequences,
    save_reward_model,
)
from rlscope.supervised.loop import JobConfig, JobResult, job_task, run_job, torch_threads
from rlscope.tasks import make_task
from rlscope.tasks.base import PreferencePair, PreferencePairs
from rlscope.utils import resolve_device

HELDOUT_SEED_OFFSET = 2_000_029
"""Held-out pairs come from a generator seeded with seed + this (never the training one)."""
PROBE_SEED_OFFSET = 3_000_017


@dataclass(frozen=True)
class RmConfig(JobConfig):
    """Train a reward model with the Bradley–Terry loss on a task's generated preference
    pairs, then save it for ``rlscope train --rm_path``."""

    task: str = "preference_rm"
    """Task whose preference pairs (task.preference_pairs) train the model and whose prompt
    width and completion length shape its input."""
    batch_size: int = 64
    """Fresh pairs per step."""
    lr: float = 1e-3
    """Adam learning rate."""
    seed: int = 0
    """Model init and pair order (held-out pairs: seed + 2000029)."""
    heldout_pairs: int = 512
    """Held-out pairs for rm/heldout_accuracy (and as many repeat-probe pairs)."""
    init: str = ""
    """Start the backbone from these policy weights (an rlscope sft output directory or
    sft.pt; same model options); empty = random init."""
    name: str = ""
    """Output directory name (default: rm_<task>_s<seed>_<time>); pass runs_dir/name to
    rlscope train --rm_path."""


RmResult = JobResult
"""What `train_rm` returns (`rlscope.supervised.loop.JobResult`)."""


def validate_rm(cfg: RmConfig) -> list[str]:
    """Every problem of ``cfg`` (empty when it can run)."""
    errors, task = job_task(cfg, cfg.task)
    if task is None:
        return errors
    if not isinstance(task, PreferencePairs):
        errors.append(f"task {cfg.task!r} generates no preference pairs: use --task "
                      "preference_rm")
    if cfg.task_options.rm_path:
        errors.append("--rm_path names a reward model to train against; rlscope rm writes one "
                      "(give --name instead)")
    if cfg.model.lora_rank:
        errors.append("model.lora_rank > 0 is not supported for reward models: leave it at 0")
    if cfg.init and not Path(cfg.init).exists():
        errors.append(f"--init {cfg.init}: no such file or directory")
    if cfg.batch_size < 1 or cfg.lr <= 0 or cfg.heldout_pairs < 1:  # counts < 0: job_errors
        errors.append("--num_steps and --eval_every must be >= 0, --batch_size and "
                      "--heldout_pairs >= 1, --lr > 0")
    return errors


def pair_tensors(pairs: Sequence[PreferencePair], width: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens_NL, attention_NL)`` with N = 2B: the B chosen sequences, then the B rejected
    ones (`pack_sequences`)."""
    prompts = [p.prompt for p in pairs] * 2
    completions = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    return pack_sequences(prompts, completions, width)


def score_pairs(rm: RewardModel, pairs: Sequence[PreferencePair], width: int,
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(chosen_B, rejected_B)`` raw scores of ``pairs`` in one forward pass."""
    tokens_NL, attention_NL = (x.to(device) for x in pair_tensors(pairs, width))
    scores_N = rm(tokens_NL, attention_NL)
    B = len(pairs)
    return scores_N[:B], scores_N[B:]


def train_rm(cfg: RmConfig) -> RmResult:
    """Train and save the reward model of ``cfg`` (module docstring)."""
    errors = validate_rm(cfg)
    if errors:
        raise ValueError("invalid configuration:\n  - " + "\n  - ".join(errors))
    task = make_task(cfg.task, cfg.task_options)
    device = resolve_device(cfg.device)
    with torch_threads(cfg.threads):
        torch.manual_seed(cfg.seed)
        width = task.prompt_len + task.completion_len
        rm = build_reward_model(cfg.model, task.vocab_size, width).to(device)
        if cfg.init:
            checkpoint.load_init(cfg.init, rm.backbone, device)
        optimizer = torch.optim.Adam(rm.parameters(), lr=cfg.lr)
        generator = torch.Generator().manual_seed(cfg.seed)
        if not isinstance(task, PreferencePairs):  # validate_rm rejects it first
            raise ValueError(f"task {task.name!r} generates no preference pairs")
        heldout = task.preference_pairs(
            torch.Generator().manual_seed(cfg.seed + HELDOUT_SEED_OFFSET), cfg.heldout_pairs)
        probe = task.repeat_probe_pairs(
            torch.Generator().manual_seed(cfg.seed + PROBE_SEED_OFFSET), cfg.heldout_pairs)

        def evaluate_now() -> dict[str, float]:
            rm.eval()
            with torch.no_grad():
                chosen_B, rejected_B = score_pairs(rm, heldout, width, device)
                loss, m = bradley_terry_loss(chosen_B, rejected_B)
                record = {"rm/heldout_loss": float(loss),
                          "rm/heldout_accuracy": float(m["rm/accuracy"])}
                c_B, r_B = score_pairs(rm, probe, width, device)
                record["rm/probe_accuracy"] = float((c_B > r_B).float().mean())
            return record

        def step(_: int) -> dict[str, float]:
            pairs = task.preference_pairs(generator, cfg.batch_size)
            rm.train()
            loss, m = bradley_terry_loss(*score_pairs(rm, pairs, width, device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            return {"rm/loss": float(loss.detach()), **{k: float(v) for k, v in m.items()}}

        def save(out_dir: Path, evals: list[dict[str, float]]) -> None:
            with torch.no_grad():
                rm.set_standardisation(torch.cat(score_pairs(rm, heldout, width, device)))
            save_reward_model(out_dir, rm, cfg.model, cfg.task, cfg.task_options,
                              task.vocab_size, task.prompt_len, task.completion_len,
                              {"steps": cfg.num_steps, "seed": cfg.seed,
                               **{k: v for k, v in evals[-1].items() if k != "step"}})

        return run_job("rm", cfg, task, device, step, evaluate_now, save)
