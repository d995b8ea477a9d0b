"""Probe ``puzzle_topology`` (COMPANIONS.md §5): does a puzzle set's topology keep the
reward-contrast law, and how many of replay's actions come after the first error?

A synthetic stand-in, with the same structure, for the reference's private chess-puzzle set.
Generator `puzzle_paths`: ``--num_puzzles`` puzzles; the solver's horizon H ∈ 1..6 with weights
(2, 8, 6, 2, 1, 1) **(choice)**; solver moves alternate with deterministic (teacher-forced)
replies, so a puzzle is its H solver states; a state has n legal moves, n uniform in 2..40, or
n = 1 (forced, no decision) with probability ``--forced_rate``; D = the unforced states.

The controlled policy puts p = ``--correct_probability`` on the solution move and (1 − p)/(n − 1)
on each other; forced moves are certain. K = ``--group_size`` rollouts per puzzle, paired
between the protocols (the same draws): ``strict`` ends at the first wrong solver move;
``replay`` keeps replaying the solution's replies, so the solver acts at every solution-line
state (H actions); the terminal reward (every solver move right) is identical.

Per seed, per H and overall: puzzles, mean D, exact reward mean p^D, sampled reward, exact
mean M(p^D, K), sampled mixed-group rate, strict actions (exact Σ reach, sampled), replay
actions (= H) and replay's post-error actions (sampled; exact H − Σ reach).

Instruments for a learned policy on such puzzles (`teacher_forced_instruments`):
teacher-forced q̂ = Π over unforced states of π(solution move | solution prefix), the contrast
mass mean M(q̂, K), the decision cross-entropy (mean −log π at unforced states) and the total
cross-entropy (all solution tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlscope.metrics.learnability import mixed_group_probability
from rlscope.probes.base import ProbeResult, Row, markdown_table, mean

HORIZON_WEIGHTS = (2.0, 8.0, 6.0, 2.0, 1.0, 1.0)
"""Relative frequency of solver horizons H = 1..6 **(choice)**."""
MIN_MOVES, MAX_MOVES = 2, 40
PROTOCOLS = ("strict", "replay", "both")


@dataclass(frozen=True)
class PuzzleConfig:
    """Options of ``rlscope probe puzzle_topology``."""

    num_puzzles: int = 20_000
    """Puzzles generated per seed."""
    forced_rate: float = 0.01
    """Probability in [0, 1) that a solver state is forced (one legal move, no decision)."""
    correct_probability: float = 0.6
    """p in (0, 1): the controlled policy's probability of the solution move."""
    group_size: int = 8
    """K rollouts per puzzle (>= 2)."""
    protocol: str = "both"
    """strict (end at the first wrong solver move), replay (the solver acts at every
    solution-line state) or both, paired on the same draws."""
    num_seeds: int = 3
    """Seeds seed, seed + 1, ..."""
    seed: int = 0
    """First seed."""
    out_dir: str = "probes/puzzle_topology"
    """Directory for puzzle_topology.csv and summary.md."""


def puzzle_errors(cfg: PuzzleConfig) -> list[str]:
    """Why ``cfg`` cannot run, each naming the option to change."""
    errors = []
    if cfg.num_puzzles < 1 or cfg.num_seeds < 1:
        errors.append("--num_puzzles and --num_seeds must be >= 1")
    if not 0 <= cfg.forced_rate < 1:
        errors.append(f"--forced_rate={cfg.forced_rate} must be in [0, 1)")
    if not 0 < cfg.correct_probability < 1:
        errors.append(f"--correct_probability={cfg.correct_probability} must be in (0, 1)")
    if cfg.group_size < 2:
        errors.append(f"--group_size={cfg.group_size} must be >= 2 (a group of one has no "
                      "contrast)")
    if cfg.protocol not in PROTOCOLS:
        errors.append(f"--protocol={cfg.protocol!r}: choose strict, replay or both")
    return errors


@dataclass(frozen=True)
class PuzzlePaths:
    """Generated puzzles: horizon ``[P]`` and legal moves per solver state ``[P, 6]`` (0
    beyond the horizon; 1 = forced)."""

    horizon_P: torch.Tensor
    moves_PH: torch.Tensor

    @property
    def state_mask_PH(self) -> torch.Tensor:
        return self.moves_PH > 0

    @property
    def decisions_P(self) -> torch.Tensor:
        """D: the unforced solver states."""
        return (self.moves_PH > 1).sum(-1)


def puzzle_paths(num_puzzles: int, forced_rate: float, generator: torch.Generator
                 ) -> PuzzlePaths:
    """The synthetic puzzle set (module docstring)."""
    h_max = len(HORIZON_WEIGHTS)
    horizon_P = torch.multinomial(torch.tensor(HORIZON_WEIGHTS), num_puzzles, replacement=True,
                                  generator=generator) + 1
    moves_PH = torch.randint(MIN_MOVES, MAX_MOVES + 1, (num_puzzles, h_max), generator=generator)
    forced_PH = torch.rand(num_puzzles, h_max, generator=generator) < forced_rate
    moves_PH = torch.where(forced_PH, torch.ones_like(moves_PH), moves_PH)
    inside_PH = torch.arange(h_max) < horizon_P[:, None]
    return PuzzlePaths(horizon_P, torch.where(inside_PH, moves_PH, torch.zeros_like(moves_PH)))


def rollout_outcomes(paths: PuzzlePaths, p: float, group_size: int,
                     generator: torch.Generator) -> dict[str, torch.Tensor]:
    """K paired rollouts per puzzle: ``correct_PKH`` (the solver's move at each solution-line
    state is right; forced and out-of-horizon states count as right), ``reward_PK``,
    ``strict_actions_PK`` (actions up to and including the first wrong one) and
    ``post_error_PK`` (replay's actions after the first wrong one)."""
    P, H = paths.moves_PH.shape
    decision_PH = paths.moves_PH > 1
    draw_PKH = torch.rand(P, group_size, H, generator=generator) < p
    correct_PKH = draw_PKH | ~decision_PH[:, None]
    alive_PKH = correct_PKH.long().cumprod(-1)
    reached_PKH = torch.cat([torch.ones_like(alive_PKH[..., :1]), alive_PKH[..., :-1]], -1)
    in_line_PKH = paths.state_mask_PH[:, None].long()
    strict_PK = (reached_PKH * in_line_PKH).sum(-1)
    return {"correct_PKH": correct_PKH, "reward_PK": correct_PKH.all(-1).float(),
            "strict_actions_PK": strict_PK.float(),
            "post_error_PK": (paths.horizon_P[:, None] - strict_PK).float()}


def exact_outcomes(paths: PuzzlePaths, p: float, group_size: int) -> dict[str, torch.Tensor]:
    """Per puzzle: exact reward p^D, M(p^D, K) and strict actions Σ_h reach_h."""
    d_P = paths.decisions_P.double()
    ones_PH = torch.ones_like(paths.moves_PH, dtype=torch.float64)
    p_PH = torch.where(paths.moves_PH > 1, ones_PH * p, ones_PH)
    reach_PH = torch.cat([torch.ones_like(p_PH[:, :1]), p_PH.cumprod(-1)[:, :-1]], -1)
    q_P = torch.tensor(p, dtype=torch.float64).pow(d_P)
    return {"reward_P": q_P, "mixed_P": mixed_group_probability(q_P, group_size),
            "strict_actions_P": (reach_PH * paths.state_mask_PH).sum(-1)}


def teacher_forced_instruments(logp_solution_PH: torch.Tensor, decision_mask_PH: torch.Tensor,
                               token_mask_PH: torch.Tensor, group_size: int
                               ) -> dict[str, float]:
    """A learned policy's instruments from log π(solution move | solution prefix) at every
    solution token ``logp_solution_PH``: q̂ = Π over decisions (unforced states) of π, the
    contrast mass mean M(q̂, K), the decision cross-entropy (mean −log π over decisions) and the
    total cross-entropy (mean −log π over every solution token, ``token_mask_PH``)."""
    decision = decision_mask_PH.to(logp_solution_PH.dtype)
    tokens = token_mask_PH.to(logp_solution_PH.dtype)
    q_P = (logp_solution_PH * decision).sum(-1).exp()
    return {"teacher_forced_q": float(q_P.mean()),
            "contrast_mass": float(mixed_group_probability(q_P, group_size).mean()),
            "decision_ce": float(-(logp_solution_PH * decision).sum() / decision.sum()),
            "total_ce": float(-(logp_solution_PH * tokens).sum() / tokens.sum())}


def _row(seed: int, horizon: str, select_P: torch.Tensor, paths: PuzzlePaths,
         sampled: dict[str, torch.Tensor], exact: dict[str, torch.Tensor], cfg: PuzzleConfig
         ) -> Row:
    reward_PK = sampled["reward_PK"][select_P]
    std_P = reward_PK.std(-1, unbiased=False)
    row: Row = {"seed": seed, "horizon": horizon, "puzzles": int(select_P.sum()),
                "mean_decisions": float(paths.decisions_P[select_P].float().mean()),
                "exact_reward": float(exact["reward_P"][select_P].mean()),
                "sampled_reward": float(reward_PK.mean()),
                "exact_mixed_rate": float(exact["mixed_P"][select_P].mean()),
                "sampled_mixed_rate": float((std_P > 1e-6).float().mean())}
    if cfg.protocol in ("strict", "both"):
        row |= {"strict_actions_exact": float(exact["strict_actions_P"][select_P].mean()),
                "strict_actions_sampled": float(sampled["strict_actions_PK"][select_P].mean())}
    if cfg.protocol in ("replay", "both"):
        replay = float(paths.horizon_P[select_P].float().mean())
        post = float(sampled["post_error_PK"][select_P].mean())
        row |= {"replay_actions": replay, "replay_post_error_actions": post,
                "replay_post_error_share": post / replay}
    return row


def run_puzzles(cfg: PuzzleConfig) -> ProbeResult:
    """Every seed: generate, roll out K paired rollouts per puzzle, compare with the exact
    law per H and overall."""
    errors = puzzle_errors(cfg)
    if errors:
        raise ValueError("; ".join(errors))
    rows: list[Row] = []
    for seed in range(cfg.seed, cfg.seed + cfg.num_seeds):
        generator = torch.Generator().manual_seed(seed)
        paths = puzzle_paths(cfg.num_puzzles, cfg.forced_rate, generator)
        sampled = rollout_outcomes(paths, cfg.correct_probability, cfg.group_size, generator)
        exact = exact_outcomes(paths, cfg.correct_probability, cfg.group_size)
        for h in range(1, len(HORIZON_WEIGHTS) + 1):
            select_P = paths.horizon_P == h
            if bool(select_P.any()):
                rows.append(_row(seed, str(h), select_P, paths, sampled, exact, cfg))
        rows.append(_row(seed, "all", torch.ones_like(paths.horizon_P, dtype=torch.bool), paths,
                         sampled, exact, cfg))
    return ProbeResult(rows=rows, summary=summarise(rows, cfg))


def summarise(rows: list[Row], cfg: PuzzleConfig) -> str:
    """Seed means per H and overall."""
    keys = [k for k in rows[0] if k not in ("seed", "horizon")]
    table = []
    for h in dict.fromkeys(str(r["horizon"]) for r in rows):
        chosen = [r for r in rows if r["horizon"] == h]
        table.append((h, *(mean([float(r[k]) for r in chosen if k in r]) for k in keys)))
    return "\n".join([
        "# puzzle_topology", "",
        f"{cfg.num_puzzles} synthetic puzzles per seed, {cfg.num_seeds} seeds, p = "
        f"{cfg.correct_probability}, K = {cfg.group_size}, forced rate {cfg.forced_rate}, "
        f"protocol {cfg.protocol} (paired draws). Seed means.", "",
        markdown_table(("H", *keys), table),
        "Questions: does this topology keep the analytical law (exact vs sampled reward and "
        "mixed rate)? What share of replay's actions follows the first error?", ""])
