"""The reward model: a policy backbone with a scalar head read at the last real token, its
Bradley–Terry loss, the sequence layout it reads, and its checkpoint.

r_θ(x, y) = w · h_L + b, where h_L is the backbone's final hidden state at the last real token
of prompt x followed by completion y (the tiny transformer or any Hugging Face causal LM, as
built by `rlscope.policy.build_policy`; its LM head is unused). Trained on comparisons
(y_c preferred to y_r) with the Bradley–Terry likelihood P(y_c ≻ y_r) = σ(r_c − r_r)
(Bradley & Terry 1952; as the reward model of RLHF in Ouyang et al. arXiv:2203.02155 and
Stiennon et al. arXiv:2009.01325). Valid regime: pairwise preferences over sequences that fit
the backbone's positions; the score is only meaningful up to an additive constant, so the
checkpoint stores the mean and std of its scores on held-out generated answers and
`RewardModel.standardised` reports (r − mean) / std.

Layout: prompt and completion ids are concatenated and left-padded to a fixed width with an
attention mask (`pack_sequences`), so the last position is the last real token and positions
count real tokens only: a sequence scores the same alone or in a padded batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rlscope.files import atomic_save, safe_load
from rlscope.policy import ModelConfig, build_policy
from rlscope.policy.value_head import ValueHead

RM_FILE = "rm.pt"
"""The weights file `rlscope rm` writes in its output directory."""
KIND = "rlscope_reward_model"
PAD_ID = 0


def bradley_terry_loss(chosen_B: torch.Tensor, rejected_B: torch.Tensor
                       ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Mean of −log σ(r_chosen − r_rejected) over ``[B]`` pairs (computed as softplus of the
    negated margin, stable for any margin).

    Metrics (detached): ``rm/accuracy`` = share of pairs with r_chosen > r_rejected (a tie
    counts as wrong), ``rm/margin`` = mean r_chosen − r_rejected. Source: Bradley & Terry
    1952; Ouyang et al. arXiv:2203.02155 eq. 1 (with K = 2)."""
    if chosen_B.shape != rejected_B.shape or chosen_B.dim() != 1:
        raise ValueError(f"expected two [B] tensors, got {tuple(chosen_B.shape)} and "
                         f"{tuple(rejected_B.shape)}")
    margin_B = chosen_B.float() - rejected_B.float()
    loss = F.softplus(-margin_B).mean()
    return loss, {"rm/accuracy": (margin_B > 0).float().mean().detach(),
                  "rm/margin": margin_B.mean().detach()}


def pack_sequences(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                   width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens_BL, attention_BL)``: each prompt followed by its completion, left-padded with
    `PAD_ID` to ``width`` (L = width), attention 1 on real tokens. An empty or too long
    sequence is a ValueError."""
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    tokens_BL = torch.full((len(prompts), width), PAD_ID, dtype=torch.long)
    attention_BL = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        ids = [*p, *c]
        if not 0 < len(ids) <= width:
            raise ValueError(f"sequence {i} of {len(ids)} tokens does not fit 1..{width}")
        tokens_BL[i, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
        attention_BL[i, width - len(ids):] = 1
    return tokens_BL, attention_BL


def last_real_index(attention_BL: torch.Tensor) -> torch.Tensor:
    """``[B]`` long: the position of each row's last token with attention 1 (left or right
    padding alike)."""
    L = attention_BL.shape[1]
    return L - 1 - attention_BL.bool().flip(-1).long().argmax(-1)


class RewardModel(nn.Module):
    """r(x, y) = w · h_last + b on a policy backbone (module docstring)."""

    score_mean: torch.Tensor
    score_std: torch.Tensor

    def __init__(self, backbone: nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = ValueHead(hidden_size)
        self.register_buffer("score_mean", torch.zeros(()))
        self.register_buffer("score_std", torch.ones(()))

    def forward(self, tokens_BL: torch.Tensor, attention_BL: torch.Tensor) -> torch.Tensor:
        """Raw scores ``[B]`` read at each row's last real token."""
        hidden_BLD = self.backbone(tokens_BL, attention_BL)[1]
        rows_B = torch.arange(tokens_BL.shape[0], device=tokens_BL.device)
        h_B1D = hidden_BLD[rows_B, last_real_index(attention_BL)][:, None]
        return self.head(h_B1D)[:, 0]

    def standardised(self, tokens_BL: torch.Tensor, attention_BL: torch.Tensor
                     ) -> torch.Tensor:
        """``[B]`` (r − score_mean) / score_std: the training reward of ``preference_rm``."""
        return (self(tokens_BL, attention_BL) - self.score_mean) / self.score_std

    def set_standardisation(self, scores_N: torch.Tensor) -> None:
        """Store the mean and std (floored at 1e-6) of raw scores on reference answers."""
        self.score_mean.fill_(float(scores_N.mean()))
        self.score_std.fill_(max(float(scores_N.std()), 1e-6))


def build_reward_model(model_cfg: ModelConfig, vocab_size: int, max_len: int) -> RewardModel:
    """A fresh reward model over ``vocab_size`` ids and ``max_len`` positions (seed the global
    torch RNG first for reproducibility)."""
    backbone = build_policy(model_cfg, vocab_size, max_len)
    if not isinstance(backbone, nn.Module):
        raise TypeError(f"backbone {type(backbone).__name__} is not a torch module")
    dtype = next(backbone.parameters()).dtype
    return RewardModel(backbone, backbone.hidden_size).to(dtype)


def save_reward_model(out_dir: Path, rm: RewardModel, model_cfg: ModelConfig, task: str,
                      task_options: object, vocab_size: int, prompt_len: int,
                      completion_len: int, extra: dict[str, Any]) -> Path:
    """Write ``rm.pt`` atomically: weights, model config, task, sequence widths, ``extra``."""
    payload: dict[str, Any] = {
        "kind": KIND, "reward_model": rm.state_dict(), "model": dataclasses.asdict(model_cfg),
        "task": task, "task_options": dataclasses.asdict(task_options),  # type: ignore[call-overload]
        "vocab_size": vocab_size, "prompt_len": prompt_len, "completion_len": completion_len,
        **extra}
    return atomic_save(payload, out_dir / RM_FILE)


def rm_file(path: str) -> Path:
    """The weights file ``--rm_path`` names: the file itself or ``rm.pt`` inside a directory;
    FileNotFoundError with what to do when there is none."""
    p = Path(path)
    if p.is_dir():
        p = p / RM_FILE
    if not p.is_file():
        raise FileNotFoundError(
            f"--rm_path {path}: no reward model there (expected a file or a directory holding "
            f"{RM_FILE}); train one with `rlscope rm --task preference_rm --name NAME` and pass "
            "--rm_path runs/NAME")
    return p


def _payload(path: str) -> dict[str, Any]:
    payload = safe_load(rm_file(path), "--rm_path")
    if payload.get("kind") != KIND:
        raise ValueError(f"--rm_path {path}: not an rlscope reward model (write one with "
                         "`rlscope rm`; an sft.pt or a training checkpoint is a policy)")
    return payload


def _compatibility(payload: dict[str, Any], path: str, task: str, prompt_len: int,
                   completion_len: int) -> list[str]:
    errors = []
    if payload["task"] != task:
        errors.append(f"--rm_path {path}: the reward model was trained for task "
                      f"{payload['task']!r}, not {task!r}")
    if payload["prompt_len"] + payload["completion_len"] < prompt_len + completion_len:
        errors.append(f"--rm_path {path}: the reward model reads at most "
                      f"{payload['prompt_len'] + payload['completion_len']} tokens but prompts "
                      f"and completions here take {prompt_len + completion_len}: use "
                      f"--length_limit {payload['completion_len']} or lower, or retrain the RM "
                      "with this --length_limit")
    return errors


def reward_model_errors(path: str, task: str, prompt_len: int, completion_len: int
                        ) -> list[str]:
    """Why the reward model at ``path`` cannot score ``task`` (empty when it can)."""
    try:
        payload = _payload(path)
    except (FileNotFoundError, ValueError) as error:
        return [str(error)]
    except Exception as error:  # a truncated or foreign file: report, never crash validation
        return [f"--rm_path {path}: cannot read it ({error!r})"]
    return _compatibility(payload, path, task, prompt_len, completion_len)


def load_reward_model(path: str, task: str, prompt_len: int, completion_len: int,
                      device: torch.device) -> RewardModel:
    """The reward model of ``path`` (see `rm_file`), frozen, in eval mode, on ``device``;
    ValueError when it is not one or does not fit ``task``'s sequences."""
    payload = _payload(path)
    errors = _compatibility(payload, path, task, prompt_len, completion_len)
    if errors:
        raise ValueError("; ".join(errors))
    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v
                              for k, v in payload["model"].items()}
    model_cfg = ModelConfig(**fields)
    rm = build_reward_model(model_cfg, payload["vocab_size"],
                            payload["prompt_len"] + payload["completion_len"])
    rm.load_state_dict(payload["reward_model"])
    return rm.to(device).requires_grad_(False).eval()
