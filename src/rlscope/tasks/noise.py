"""Reward noise on training rewards (TASKS.md, "Reward noise"; METHODS.md, "Validation").

Pure functions over explicit tensors and the `TaskConfig` fields ``reward_noise`` (p) and
``reward_noise_mode``. Each sample is hit independently with probability p; a hit changes the
reward as its mode says, where the mode applies to that row:

- ``label_flip``: r → 1 − r (every hit row).
- ``random_reward``: r → U(0, 1) (every hit row).
- ``false_positive_action0``: a wrong row gets r = 1 if it contains token 0 (bandit: if its
  action is 0).
- ``spurious_feature``: a wrong row gets r = 1 if its first output equals its first input token
  (bandit: as ``false_positive_action0``).
- ``false_positive_rare_token`` (sequence tasks only): a wrong row gets r = 1 if it contains the
  rare token SEP (id ``vocab``), which is never correct.

"Wrong" means not exactly correct. Evaluation never sees noise, and while p > 0 the exact
expected reward is hidden (`exposes_expected_reward`): it is the clean reward's expectation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlscope.tasks.base import TaskConfig

FAMILIES = ("sequence", "bandit")
NOISE_SEED_OFFSET = 2_000_003


@dataclass(frozen=True)
class NoisyRows:
    """What a noise mode reads: one row per sample, ``B`` rows, ``T`` completion and ``P``
    prompt positions (prompts unpadded, so column 0 is the first input token)."""

    rewards_B: torch.Tensor
    completion_tokens_BT: torch.Tensor
    completion_mask_BT: torch.Tensor
    prompt_tokens_BP: torch.Tensor
    wrong_B: torch.Tensor
    sep: int
    family: str


Effect = Callable[[NoisyRows, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""``(rows, uniform_B) -> (reward if corrupted [B], eligible rows [B] bool)``."""


@dataclass(frozen=True)
class NoiseMode:
    """A reward-noise mode: the task families it exists for and its effect on a hit row."""

    families: tuple[str, ...]
    effect: Effect


def _every_row(x: NoisyRows) -> torch.Tensor:
    return torch.ones_like(x.wrong_B)


def _contains(x: NoisyRows, token: int) -> torch.Tensor:
    return ((x.completion_tokens_BT == token) & x.completion_mask_BT.bool()).any(-1)


def _label_flip(x: NoisyRows, u_B: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return 1.0 - x.rewards_B, _every_row(x)


def _random_reward(x: NoisyRows, u_B: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return u_B, _every_row(x)


def _false_positive_action0(x: NoisyRows, u_B: torch.Tensor
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    if x.family == "bandit":
        has_zero_B = x.completion_tokens_BT[:, 0] == 0
    else:
        has_zero_B = _contains(x, 0)
    return torch.ones_like(x.rewards_B), x.wrong_B & has_zero_B


def _spurious_feature(x: NoisyRows, u_B: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if x.family == "bandit":
        return _false_positive_action0(x, u_B)
    echo_B = x.completion_mask_BT[:, 0].bool() & (
        x.completion_tokens_BT[:, 0] == x.prompt_tokens_BP[:, 0])
    return torch.ones_like(x.rewards_B), x.wrong_B & echo_B


def _false_positive_rare_token(x: NoisyRows, u_B: torch.Tensor
                               ) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.ones_like(x.rewards_B), x.wrong_B & _contains(x, x.sep)


NOISE_MODES: dict[str, NoiseMode] = {
    "label_flip": NoiseMode(FAMILIES, _label_flip),
    "random_reward": NoiseMode(FAMILIES, _random_reward),
    "false_positive_action0": NoiseMode(FAMILIES, _false_positive_action0),
    "spurious_feature": NoiseMode(FAMILIES, _spurious_feature),
    "false_positive_rare_token": NoiseMode(("sequence",), _false_positive_rare_token),
}
"""Every mode but ``none`` (clean rewards)."""


def validate_noise(cfg: TaskConfig, task_family: str) -> list[str]:
    """Problems with ``cfg.reward_noise`` / ``cfg.reward_noise_mode`` for a task of
    ``task_family`` ("sequence" or "bandit"), each saying what to change; [] when valid."""
    p, mode = cfg.reward_noise, cfg.reward_noise_mode
    modes = ", ".join(NOISE_MODES)
    errors = []
    if task_family not in FAMILIES:
        errors.append(f"reward noise: unknown task family {task_family!r}; expected one of "
                      f"{', '.join(FAMILIES)}")
    if not 0.0 <= p <= 1.0:
        errors.append(f"task.reward_noise={p} must lie in [0, 1] (--reward_noise)")
    if mode != "none" and mode not in NOISE_MODES:
        errors.append(f"task.reward_noise_mode={mode!r} is unknown; set --reward_noise_mode to "
                      f"none or one of {modes}")
    elif mode == "none" and p > 0:
        errors.append(f"task.reward_noise={p} needs a noise mode: set --reward_noise_mode to "
                      f"one of {modes}, or --reward_noise 0 for clean rewards")
    elif mode != "none" and p == 0:
        errors.append(f"task.reward_noise_mode={mode!r} does nothing with reward_noise=0: set "
                      "--reward_noise in (0, 1], or --reward_noise_mode none")
    if mode in NOISE_MODES and task_family in FAMILIES:
        families = NOISE_MODES[mode].families
        if task_family not in families:
            valid = ", ".join(m for m, spec in NOISE_MODES.items() if task_family in spec.families)
            errors.append(f"task.reward_noise_mode={mode!r} exists only for "
                          f"{' and '.join(families)} tasks, not {task_family} tasks; choose "
                          f"one of {valid}")
    return errors


def exposes_expected_reward(cfg: TaskConfig) -> bool:
    """Whether a task may expose its exact expected reward: only while training rewards are
    clean (with noise the clean expectation is no baseline for the noisy reward, so baselines
    fall back to Σπ²)."""
    return cfg.reward_noise == 0.0


def noise_generator(seed: int, step: int) -> torch.Generator:
    """The noise draws of step ``step`` of run ``seed``: a stream apart from the prompt and
    sampling stream (adding noise leaves prompts and rollouts unchanged) that needs no
    checkpoint state (a resumed run redraws the same noise)."""
    # CPU generators keep only the low 32 bits of a seed: mix within them
    return torch.Generator().manual_seed((NOISE_SEED_OFFSET + seed * 1_000_003 + step) % 2**32)


def apply_reward_noise(rewards_B: torch.Tensor, completion_tokens_BT: torch.Tensor,
                       completion_mask_BT: torch.Tensor, prompt_tokens_BP: torch.Tensor,
                       correct_B: torch.Tensor, cfg: TaskConfig, task_family: str,
                       generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Corrupt training rewards: ``(noisy_rewards_B, corrupted_B)``.

    Shapes: ``rewards_B`` [B] (clean), ``completion_tokens_BT`` / ``completion_mask_BT``
    [B, T], ``prompt_tokens_BP`` [B, P] (unpadded), ``correct_B`` [B] bool (exactly correct).
    ``corrupted_B`` marks rows whose reward the noise replaced: hit (probability
    ``cfg.reward_noise``, independently per row) and eligible for the mode. Every call with
    noise draws 2·B uniforms from ``generator`` whatever the mode and the data, so one seed
    hits the same rows under every mode; mode ``none`` draws nothing and returns the rewards.
    Raises ValueError on an invalid configuration (`validate_noise`) or mismatched shapes.
    """
    errors = validate_noise(cfg, task_family)
    if errors:
        raise ValueError("invalid reward noise: " + "; ".join(errors))
    B = rewards_B.shape[0]
    if rewards_B.dim() != 1 or correct_B.shape != (B,):
        raise ValueError(f"rewards_B {tuple(rewards_B.shape)} and correct_B "
                         f"{tuple(correct_B.shape)} must both be [B]")
    for name, t in (("completion_tokens_BT", completion_tokens_BT),
                    ("completion_mask_BT", completion_mask_BT),
                    ("prompt_tokens_BP", prompt_tokens_BP)):
        if t.dim() != 2 or t.shape[0] != B:
            raise ValueError(f"{name} {tuple(t.shape)} must be [B={B}, ...]")
    if cfg.reward_noise_mode == "none":
        return rewards_B, torch.zeros(B, dtype=torch.bool, device=rewards_B.device)
    u_2B = torch.rand(2, B, generator=generator, device=generator.device).to(rewards_B.device)
    rows = NoisyRows(rewards_B, completion_tokens_BT, completion_mask_BT, prompt_tokens_BP,
                     ~correct_B.bool(), sep=cfg.vocab, family=task_family)
    new_B, eligible_B = NOISE_MODES[cfg.reward_noise_mode].effect(rows, u_2B[1])
    corrupted_B = (u_2B[0] < cfg.reward_noise) & eligible_B
    return torch.where(corrupted_B, new_B.to(rewards_B.dtype), rewards_B), corrupted_B
