"""Supervised warm start: ``rlscope sft`` (TASKS.md, "Real-model tasks": where a base policy
that already knows the format is needed, the project trains it itself).

Cross-entropy on the completion tokens of prompt/completion pairs, the prompt tokens masked
out of the loss. Pairs come from the task (``task.sft_pairs(generator, n)``: fresh correct
pairs every step; arithmetic and the token sandbox have it) or from a JSONL file of
``{"prompt": str, "completion": str}`` lines tokenised with the task's byte tokenizer (the
completion as written: end it with the stop token, a newline, to teach stopping).

Layout of a batch: the prompt left-padded to the task's ``prompt_len`` (attention mask 0 on
padding), then the completion right-padded to ``completion_len`` with the task's first stop
token (or 0); the logits at position j predict token j + 1; the loss mask is 1 exactly on the
completion's own tokens. An interactive task's pairs are its environments' demonstration
episodes (`rlscope.tasks.episodes.EpisodeTask.sft_pairs`): the completion is the interleaved
policy and environment segments and carries a per-token mask (`MaskedPair`), so the loss covers
the policy's segments only; the environment's tokens are context. The output directory holds
``sft.pt`` (policy weights, model config, task name and options: what ``rlscope train --init``
reads), ``config.json`` and ``metrics.jsonl`` (``sft/loss`` every step; ``sft/heldout_loss``
and the task's greedy ``eval/*`` metrics on its held-out prompts every ``eval_every`` steps
and at the end).
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlscope.batch import PromptBatch
from rlscope.checkpoint import SFT_FILE, atomic_save
from rlscope.envs.demos import Demonstrator
from rlscope.evaluation import evaluate, heldout_batch
from rlscope.supervised.loop import JobConfig, JobResult, job_task, run_job, torch_threads
from rlscope.tasks import Task, make_task
from rlscope.tasks.base import (
    Interactive,
    MaskedPair,
    Pair,
    SupervisedPairs,
    Tokenized,
    make_policy_for,
)
from rlscope.utils import resolve_device

HELDOUT_SEED_OFFSET = 2_000_029
"""Held-out SFT pairs come from a generator seeded with seed + this (never the training one)."""
HELDOUT_PAIRS = 256


@dataclass(frozen=True)
class SftConfig(JobConfig):
    """A supervised warm start: cross-entropy on completion tokens, then a checkpoint."""

    task: str = "arithmetic"
    """Task whose tokenizer, prompt width and completion length shape the data (and whose
    held-out prompts evaluate the model)."""
    data: str = ""
    """JSONL file of {"prompt": ..., "completion": ...} strings; empty = pairs the task
    generates (task.sft_pairs)."""
    batch_size: int = 64
    """Pairs per step (drawn fresh from the task, or uniformly with replacement from --data)."""
    lr: float = 3e-3
    """Adam learning rate."""
    seed: int = 0
    """Model init and data order; the evaluation set is the task's for this seed (as in
    rlscope train with the same --seed)."""
    name: str = ""
    """Output directory name (default: sft_<task>_s<seed>_<time>)."""


SftResult = JobResult
"""What `sft` returns (`rlscope.supervised.loop.JobResult`)."""


def sft_loss(logits_BLV: torch.Tensor, targets_BL: torch.Tensor, mask_BL: torch.Tensor
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Mean token cross-entropy −log softmax(logits)[target] over positions with mask 1.

    ``logits_BLV[:, j]`` predicts ``targets_BL[:, j]``; positions with mask 0 (prompt, padding)
    contribute nothing, whatever their targets. Returns ``(loss, {"sft/tokens": count})``."""
    logp_BLV = logits_BLV.float().log_softmax(-1)
    nll_BL = -logp_BLV.gather(-1, targets_BL.clamp_min(0)[..., None])[..., 0]
    mask_BL = mask_BL.to(nll_BL.dtype)
    count = mask_BL.sum()
    return (nll_BL * mask_BL).sum() / count.clamp_min(1.0), {"sft/tokens": count.detach()}


def pad_id(task: Task) -> int:
    """Right padding of completions: the task's first stop token, else 0."""
    stops = task.traits.stop_token_ids
    return stops[0] if stops else 0


def sft_batch(pairs: Sequence[Pair | MaskedPair], prompt_len: int, completion_len: int,
              pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(tokens_BL, attention_BL, targets_BL, loss_mask_BL)``, L = prompt_len + completion_len
    (see the module docstring); a pair that does not fit is a ValueError. A `MaskedPair`'s
    completion mask selects which of its tokens are predicted in the loss (the others are
    context)."""
    P, T = prompt_len, completion_len
    B = len(pairs)
    tokens_BL = torch.full((B, P + T), pad, dtype=torch.long)
    attention_BL = torch.ones(B, P + T, dtype=torch.long)
    loss_BL = torch.zeros(B, P + T)
    for i, pair in enumerate(pairs):
        prompt, completion = pair[0], pair[1]
        if not 0 < len(prompt) <= P or not 0 < len(completion) <= T:
            raise ValueError(f"pair {i}: a prompt of {len(prompt)} and a completion of "
                             f"{len(completion)} tokens must fit 1..{P} and 1..{T} (the task's "
                             "prompt_len and completion_len)")
        tokens_BL[i, P - len(prompt):P] = torch.tensor(prompt)
        attention_BL[i, :P - len(prompt)] = 0
        tokens_BL[i, P:P + len(completion)] = torch.tensor(completion)
        if len(pair) == 3:  # a MaskedPair: only the completion tokens with mask 1 are learnt
            mask = pair[2]  # type: ignore[misc]
            if len(mask) != len(completion):
                raise ValueError(f"pair {i}: a loss mask of {len(mask)} for a completion of "
                                 f"{len(completion)} tokens")
            loss_BL[i, P - 1:P - 1 + len(completion)] = torch.tensor(mask, dtype=torch.float)
        else:
            loss_BL[i, P - 1:P - 1 + len(completion)] = 1.0  # positions predicting it
    targets_BL = torch.cat([tokens_BL[:, 1:], torch.full((B, 1), pad)], 1)
    return tokens_BL, attention_BL, targets_BL, loss_BL


def read_pairs(path: str, task: Task) -> list[Pair | MaskedPair]:
    """The JSONL pairs of ``path`` tokenised with ``task.tokenizer``; clear errors for a task
    without a text tokenizer or a malformed line."""
    if not isinstance(task, Tokenized):
        raise ValueError(f"--data needs a task with a text tokenizer; {task.name!r} has none "
                         "(use its generated pairs: leave --data empty)")
    pairs: list[Pair | MaskedPair] = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) \
                or not isinstance(row.get("completion"), str):
            raise ValueError(f"{path}:{n}: expected {{\"prompt\": str, \"completion\": str}}")
        pairs.append((task.tokenizer.encode(row["prompt"]),
                      task.tokenizer.encode(row["completion"])))
    if not pairs:
        raise ValueError(f"{path}: no pairs")
    return pairs


def validate_sft(cfg: SftConfig) -> list[str]:
    """Every problem of ``cfg`` (empty when it can run)."""
    errors, task = job_task(cfg, cfg.task)
    if task is None:
        return errors
    if not cfg.data and not isinstance(task, SupervisedPairs):
        errors.append(f"task {cfg.task!r} generates no supervised pairs: give --data FILE.jsonl")
    if not cfg.data and isinstance(task, Interactive) \
            and not isinstance(task.environment_factory, Demonstrator):
        errors.append(f"task {cfg.task!r}: its environment has no demonstrations to warm-start "
                      "from: give --data FILE.jsonl")
    if cfg.data and not Path(cfg.data).is_file():
        errors.append(f"--data {cfg.data}: no such file")
    if cfg.batch_size < 1 or cfg.lr <= 0:  # job_errors has rejected negative counts
        errors.append("--num_steps and --eval_every must be >= 0, --batch_size >= 1, --lr > 0")
    return errors


def _pairs_of(task: Task, generator: torch.Generator, n: int) -> list[Pair | MaskedPair]:
    """``n`` fresh pairs from ``task.sft_pairs`` (the `SupervisedPairs` capability)."""
    if not isinstance(task, SupervisedPairs):
        raise ValueError(f"task {task.name!r} generates no supervised pairs")
    return list(task.sft_pairs(generator, n))


def sft(cfg: SftConfig) -> SftResult:
    """Run the warm start of ``cfg`` and write its output directory (module docstring)."""
    errors = validate_sft(cfg)
    if errors:
        raise ValueError("invalid configuration:\n  - " + "\n  - ".join(errors))
    task = make_task(cfg.task, cfg.task_options)
    device = resolve_device(cfg.device)
    with torch_threads(cfg.threads):
        torch.manual_seed(cfg.seed)
        policy = make_policy_for(task, cfg.model).to(device)
        optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
        generator = torch.Generator().manual_seed(cfg.seed)
        data = read_pairs(cfg.data, task) if cfg.data else None
        heldout = data[:HELDOUT_PAIRS] if data is not None else _pairs_of(
            task, torch.Generator().manual_seed(cfg.seed + HELDOUT_SEED_OFFSET), HELDOUT_PAIRS)
        P, T, pad = task.prompt_len, task.completion_len, pad_id(task)
        stops = task.traits.stop_token_ids
        eval_prompts: PromptBatch = heldout_batch(task, cfg.seed).to(device)

        def batch_loss(pairs: Sequence[Pair | MaskedPair]) -> torch.Tensor:
            tokens, attention, targets, mask = (x.to(device)
                                                for x in sft_batch(pairs, P, T, pad))
            return sft_loss(policy(tokens, attention)[0], targets, mask)[0]

        def evaluate_now() -> dict[str, float]:
            policy.eval()
            with torch.no_grad():
                values = {k: float(v) for k, v in evaluate(
                    policy, task, [eval_prompts], T, stops, decode_graphs=False).items()}
                values["sft/heldout_loss"] = float(batch_loss(heldout))
            return values

        def step(_: int) -> dict[str, float]:
            if data is None:
                pairs = _pairs_of(task, generator, cfg.batch_size)
            else:
                index = torch.randint(0, len(data), (cfg.batch_size,), generator=generator)
                pairs = [data[i] for i in index.tolist()]
            policy.train()
            loss = batch_loss(pairs)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            return {"sft/loss": float(loss.detach())}

        return run_job("sft", cfg, task, device, step, evaluate_now,
                       lambda out_dir, _: save_sft(out_dir, policy, cfg))


def save_sft(out_dir: Path, policy: torch.nn.Module, cfg: SftConfig) -> Path:
    """Write ``sft.pt``: the policy weights, the model config, the task name and options.

    A LoRA policy also writes its adapters in PEFT format to ``out_dir/adapter``, and
    ``sft.pt`` holds the base with the adapters merged in (W + (α/r)·B·A), recorded with
    ``lora_rank`` 0: it is a plain model that ``rlscope train --init`` loads with or without
    new adapters on top."""
    state, model = policy.state_dict(), cfg.model
    if getattr(policy, "has_adapters", False):
        from rlscope.policy.hf import HFPolicy

        assert isinstance(policy, HFPolicy)
        policy.save_adapter(out_dir / "adapter")
        merged = copy.deepcopy(policy.unwrap()).merge_and_unload()  # type: ignore[operator]
        state, model = HFPolicy(merged).state_dict(), dataclasses.replace(model, lora_rank=0)
    payload: dict[str, Any] = {
        "policy": state, "model": dataclasses.asdict(model),
        "task": cfg.task, "task_options": dataclasses.asdict(cfg.task_options),
        "steps": cfg.num_steps}
    return atomic_save(payload, out_dir / SFT_FILE)
