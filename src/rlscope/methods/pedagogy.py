"""Pedagogical RL (COMPANIONS.md §3; Ziems, "Pedagogical RL"): the pure parts of the
``two_view`` step (`rlscope.steps.two_view`).

A teacher that sees the answer (the teacher view) samples completions; the frozen current
student scores each of them on its own view (no answer):

- ℓ_t = log π_s(a_t | s_t), the student's log-prob of the teacher's token;
- gap_t = max_a log π_s(a | s_t) − ℓ_t ≥ 0, the surprise gap;
- spike = (logsumexp_t(β·gap_t) − log T)/β, a soft maximum of the gaps over the T tokens
  (mean gap ≤ spike ≤ max gap: the mean as β → 0, the max as β → ∞);
- G = exp(−λ·spike), the learnability of the sample for the student.

The teacher trains by GRPO (group z-score, PPO clip, token mean; `grpo_clip_loss`) on a
teacher reward (`TEACHER_REWARDS`): R·G (``pedagogical_rl``) or R − λ·mean_t(−ℓ_t)
(``teacher_rl``). The student then imitates fresh teacher samples (`STUDENT_UPDATES`): gated
imitation with w_t = sg(σ(κ(ℓ_t − γ))) (`gated_imitation_loss`), plain SFT (w ≡ 1), or, for
``student_grpo``, GRPO on its own rollouts with no teacher at all. `TwoViewRule` is a preset's
choice of both, as data.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlscope.methods.advantages import AdvantageInputs, group_zscore
from rlscope.methods.configs import AdvantageConfig, ObjectiveConfig
from rlscope.methods.terms import clipped_surrogate, ratio

GATE_FLOOR = 1e-8
"""The gated loss's denominator max(Σ_t w_t, 1e-8): a sequence the gate shuts contributes 0."""
MIXED_STD = 1e-6
"""A group is mixed when the std of the rewards it trains on exceeds this."""


@dataclass(frozen=True)
class PedagogyConfig:
    """The ``teacher_student`` task and the ``two_view`` step (COMPANIONS.md §3: presets
    pedagogical_rl, teacher_rl, student_grpo)."""

    sum_vocab: int = 5
    """V of teacher_student: content symbols 0..V−1, the answer y = (x0 + x1) mod V; the
    separators V (query) and V + 1 (hint) make V + 2 symbols. At least 2."""
    completion_len: int = 3
    """T of teacher_student: tokens per completion over all V + 2 symbols; only the last one
    is scored (the earlier ones are free scratch). At least 1."""
    teacher_lr: float = 1e-3
    """The teacher's Adam learning rate (the student's is --lr)."""
    spike_beta: float = 5.0
    """β > 0 of spike = (logsumexp_t(β·gap_t) − log T)/β: larger is closer to the max gap."""
    learnability_lambda: float = 0.5
    """λ >= 0: G = exp(−λ·spike) (pedagogical_rl) and the surprisal penalty λ·mean_t(−ℓ_t)
    (teacher_rl)."""
    gate_kappa: float = 4.0
    """κ > 0 of the imitation gate w_t = σ(κ(ℓ_t − γ)) (pedagogical_rl): its sharpness."""
    gate_gamma: float = -2.5
    """γ of the imitation gate: the student log-prob at which a teacher token gets weight 1/2."""
    teacher_steps: int = 1
    """Teacher GRPO updates per step, each on a fresh grouped batch (pedagogical_rl,
    teacher_rl: at least 1)."""
    student_steps: int = 1
    """Student updates per step, each on a fresh batch (at least 1)."""


def unused_pedagogy_errors(cfg: PedagogyConfig, task: str) -> list[str]:
    """The pedagogy options set on a run of another task (rollout tasks read none of them)."""
    default = PedagogyConfig()
    given = [f"--{f.name}" for f in dataclasses.fields(cfg)
             if getattr(cfg, f.name) != getattr(default, f.name)]
    return [f"{', '.join(given)}: only the teacher_student task (the two_view presets) reads "
            f"{'this option' if len(given) == 1 else 'these options'}; drop "
            f"{'it' if len(given) == 1 else 'them'} for --task {task}"] if given else []


@dataclass(frozen=True)
class TwoViewRule:
    """What a ``two_view`` preset trains: its teacher reward (a key of `TEACHER_REWARDS`, or
    ``none``: no teacher) and its student update (a key of `STUDENT_UPDATES`)."""

    teacher_reward: str = "none"
    student_update: str = "student_grpo"


def student_scores(logp_BTV: torch.Tensor, tokens_BT: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ℓ_BT, gap_BT)`` of the tokens ``tokens_BT`` under the student's log-probs
    ``logp_BTV`` ``[B, T, V]``: ℓ_t = log π_s(a_t | s_t) and gap_t = max_a log π_s(a | s_t) −
    ℓ_t ≥ 0. ℓ keeps the gradient of ``logp_BTV``; the gap is detached."""
    ell_BT = logp_BTV.gather(-1, tokens_BT[..., None]).squeeze(-1)
    gap_BT = (logp_BTV.detach().max(-1).values - ell_BT.detach()).clamp_min(0.0)
    return ell_BT, gap_BT


def spike_B(gap_BT: torch.Tensor, beta: float) -> torch.Tensor:
    """spike = (logsumexp_t(β·gap_t) − log T)/β per sequence, ``[B]``: the soft maximum of the
    surprise gaps (mean ≤ spike ≤ max; → mean as β → 0, → max as β → ∞). β > 0."""
    if beta <= 0:
        raise ValueError(f"spike_beta={beta} must be > 0")
    T = gap_BT.shape[-1]
    return (torch.logsumexp(beta * gap_BT, dim=-1) - math.log(T)) / beta


def learnability_B(spike: torch.Tensor, lam: float) -> torch.Tensor:
    """G = exp(−λ·spike) ∈ (0, 1] per sequence: 1 when the student would have produced every
    token greedily, smaller the sharper its surprise."""
    return torch.exp(-lam * spike)


def gate_weights_BT(ell_BT: torch.Tensor, kappa: float, gamma: float) -> torch.Tensor:
    """w_t = sg(σ(κ(ℓ_t − γ))) ``[B, T]``: weight ≈ 1 on teacher tokens the student already
    finds likely (ℓ_t > γ), ≈ 0 on the ones it finds implausible. Detached."""
    return torch.sigmoid(kappa * (ell_BT.detach() - gamma))


def gated_imitation_loss(ell_BT: torch.Tensor, w_BT: torch.Tensor) -> torch.Tensor:
    """mean_b [Σ_t w_t·(−ℓ_t) / max(Σ_t w_t, 1e-8)]: the per-sequence, weight-normalised
    imitation loss of the teacher's tokens (gradient through ℓ only; w is a constant). With
    w ≡ 1 it is plain SFT, the per-sequence mean of −ℓ_t."""
    w_BT = w_BT.detach()
    per_seq_B = (w_BT * -ell_BT).sum(-1) / w_BT.sum(-1).clamp_min(GATE_FLOOR)
    return per_seq_B.mean()


def reward_times_learnability(task_reward_B: torch.Tensor, ell_BT: torch.Tensor,
                              gap_BT: torch.Tensor, cfg: PedagogyConfig
                              ) -> tuple[torch.Tensor, torch.Tensor]:
    """``pedagogical_rl``'s teacher reward R·G, and G per sequence (``ped/learnability``)."""
    g_B = learnability_B(spike_B(gap_BT, cfg.spike_beta), cfg.learnability_lambda)
    return task_reward_B * g_B, g_B


def reward_minus_surprisal(task_reward_B: torch.Tensor, ell_BT: torch.Tensor,
                           gap_BT: torch.Tensor, cfg: PedagogyConfig
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """``teacher_rl``'s teacher reward R − λ·mean_t(−ℓ_t), and the penalty λ·mean_t(−ℓ_t)
    per sequence (``ped/learnability``)."""
    penalty_B = cfg.learnability_lambda * (-ell_BT.detach()).mean(-1)
    return task_reward_B - penalty_B, penalty_B


TeacherReward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, PedagogyConfig],
                         tuple[torch.Tensor, torch.Tensor]]

TEACHER_REWARDS: dict[str, TeacherReward] = {
    "reward_times_learnability": reward_times_learnability,
    "reward_minus_surprisal": reward_minus_surprisal,
}
"""Teacher reward → ``(reward_B, ped/learnability's per-sequence value)`` from the task
reward R, the student's ℓ and gap on the teacher's samples, and the options."""


def gated_student_weights(ell_BT: torch.Tensor, cfg: PedagogyConfig) -> torch.Tensor:
    """``pedagogical_rl``'s imitation weights: the gate under the current student."""
    return gate_weights_BT(ell_BT, cfg.gate_kappa, cfg.gate_gamma)


def sft_weights(ell_BT: torch.Tensor, cfg: PedagogyConfig) -> torch.Tensor:
    """``teacher_rl``'s imitation weights: w ≡ 1 (plain SFT)."""
    return torch.ones_like(ell_BT.detach())


STUDENT_UPDATES: dict[str, Callable[[torch.Tensor, PedagogyConfig], torch.Tensor] | None] = {
    "gated_imitation": gated_student_weights,
    "sft": sft_weights,
    "student_grpo": None,
}
"""Student update → the imitation weights w_BT of `gated_imitation_loss` from the current
student's ℓ on fresh teacher samples, or None: GRPO on the student's own rollouts."""


def mixed_group_rate(rewards_B: torch.Tensor, group_size: int) -> torch.Tensor:
    """Share of groups (contiguous rows of ``group_size``) whose reward std exceeds 1e-6."""
    std_G = rewards_B.view(-1, group_size).std(-1, unbiased=False)
    return (std_G > MIXED_STD).float().mean()


def grpo_clip_loss(logp_BT: torch.Tensor, logp_old_BT: torch.Tensor, rewards_B: torch.Tensor,
                   group_size: int, clip: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GRPO on fixed-length completions (every token counts): A = the group z-score of
    ``rewards_B`` (0 when the group's std ≤ 1e-8; contiguous groups of ``group_size``), the
    PPO-clip surrogate −min(ρA, clip(ρ, 1 − ε, 1 + ε)A) with ρ = exp(ℓ − ℓ_old), token mean.

    Shapes: ``logp_BT`` (differentiable) and ``logp_old_BT`` ``[B, T]``, ``rewards_B`` ``[B]``.
    Returns ``(loss, stats)``: ``adv_abs_mean``, ``ratio_mean``, ``clipfrac`` (token means),
    ``loss`` and ``mixed_group_rate``, detached."""
    mask_BT = torch.ones_like(logp_old_BT)
    adv_BT = group_zscore(AdvantageInputs(rewards_B=rewards_B, mask_BT=mask_BT,
                                          group_size=group_size), AdvantageConfig())
    rho_BT = ratio(logp_BT, logp_old_BT)
    loss_BT, flags = clipped_surrogate(rho_BT, adv_BT, ObjectiveConfig(
        "ppo_clip", clip_low=clip, clip_high=clip))
    loss = loss_BT.mean()
    return loss, {"adv_abs_mean": adv_BT.abs().mean(), "ratio_mean": rho_BT.detach().mean(),
                  "clipfrac": flags["clipfrac_region"].mean(), "loss": loss.detach(),
                  "mixed_group_rate": mixed_group_rate(rewards_B, group_size)}


__all__ = ["STUDENT_UPDATES", "TEACHER_REWARDS", "PedagogyConfig", "TwoViewRule",
           "gate_weights_BT", "gated_imitation_loss", "grpo_clip_loss", "learnability_B",
           "mixed_group_rate", "reward_minus_surprisal", "reward_times_learnability",
           "spike_B", "student_scores", "unused_pedagogy_errors"]
