"""Probe ``learnability_drift`` (COMPANIONS.md §5): how fast group policy gradient lifts a cold
success probability, as a function of the start q₀, the group size K and the normalisation.

Per seed, group size K and normalisation (``mean``: A = r − mean_group r; ``std``: the group
z-score, 0 where the group's std ≤ 1e-8), a tabular policy over ``--num_prompts`` prompts of D
decisions among b actions starts homogeneous at p₀ = q₀^{1/D} for q₀ = 2^-1 … 2^-``q0_halvings``
(the target is action 0 at every state, without loss of generality: the table is symmetric in
the wrong actions). Each step samples one group of K per prompt, a wrong action ends the
episode (the actions after it are not trained on), and takes one plain SGD step (learning rate
``--lr``) on the trajectory policy-gradient loss −(1/(N·K)) Σ A Σ_t log π(a_t) (traj_group_pg's
``seq_mean_token_sum``), whose gradient on the logits is computed in closed form
(∇ log π(a) = onehot(a) − π). The exact mean success probability q̄ is read from the table
after every step.

**(choice)** drift(q₀) = (q̄_n − q₀)/n, n the first step with q̄ ≥ 2q₀ (n ≤
``--drift_max_steps``; otherwise n is that cap and the row says ``drift_reached`` 0); the
conversion time is the first step with q̄ ≥ 0.5 (≤ ``--conversion_max_steps``). Mixture mode:
each prompt's depth is uniform in 1..``--mixture_max_depth`` (its p₀ = q₀^{1/D_x}, so every
prompt starts at q₀) and the fit pools them. The summary reports per (mode, K, normalisation)
the slope of log drift on log q₀ over q₀ ≤ 0.1 (2 means dq/dt ∝ q²), per (mode, K) the
std/mean drift ratio (against √K) and the conversion-time ratio per halving of q₀ (2 means the
time doubles).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from rlscope.probes.base import (
    ProbeResult,
    Row,
    geometric_mean,
    loglog_slope,
    markdown_table,
    mean,
    parse_ints,
)

MODES = ("homogeneous", "mixture")
NORMALISATIONS = ("mean", "std")
STD_EPS = 1e-8
SLOPE_MAX_Q0 = 0.1


@dataclass(frozen=True)
class DriftConfig:
    """Options of ``rlscope probe learnability_drift``."""

    group_sizes: str = "4,8,16"
    """Group sizes K, comma-separated."""
    num_prompts: int = 64
    """Prompts N (one group per prompt per step)."""
    lr: float = 0.5
    """Plain SGD learning rate on the table's logits."""
    num_seeds: int = 3
    """Seeds seed, seed + 1, ..."""
    seed: int = 0
    """First seed."""
    branching: int = 4
    """Actions b per decision (>= 2)."""
    depth: int = 3
    """Decisions D of the homogeneous mode (>= 1)."""
    q0_halvings: int = 12
    """Start success probabilities q₀ = 2^-1 … 2^-q0_halvings."""
    drift_max_steps: int = 2000
    """Most steps to reach 2q₀ (the drift's n)."""
    conversion_max_steps: int = 30000
    """Most steps to reach q̄ ≥ 0.5 (the conversion time); also the simulation's length."""
    mixture_max_depth: int = 8
    """Mixture mode: each prompt's depth is uniform in 1..mixture_max_depth."""
    modes: str = "homogeneous,mixture"
    """Which modes to run, comma-separated: homogeneous, mixture."""
    normalisations: str = "mean,std"
    """Which advantage normalisations to run, comma-separated: mean (group_center), std
    (group_zscore)."""
    device: str = "cpu"
    """Where the tables live: cpu, cuda, cuda:N."""
    out_dir: str = "probes/learnability_drift"
    """Directory for learnability_drift.csv and summary.md."""


def drift_errors(cfg: DriftConfig) -> list[str]:
    """Why ``cfg`` cannot run, each naming the option to change."""
    errors = []
    try:
        if min(parse_ints(cfg.group_sizes, "--group_sizes")) < 2:
            errors.append(f"--group_sizes={cfg.group_sizes!r}: every K must be >= 2 (a group "
                          "of one has no contrast)")
    except ValueError as e:
        errors.append(str(e))
    for name, value, low in (("num_prompts", cfg.num_prompts, 1), ("num_seeds", cfg.num_seeds, 1),
                             ("branching", cfg.branching, 2), ("depth", cfg.depth, 1),
                             ("q0_halvings", cfg.q0_halvings, 1),
                             ("drift_max_steps", cfg.drift_max_steps, 1),
                             ("mixture_max_depth", cfg.mixture_max_depth, 1)):
        if value < low:
            errors.append(f"--{name}={value} must be >= {low}")
    if cfg.conversion_max_steps < cfg.drift_max_steps:
        errors.append(f"--conversion_max_steps={cfg.conversion_max_steps} must be >= "
                      f"--drift_max_steps={cfg.drift_max_steps}")
    if not cfg.lr > 0:
        errors.append(f"--lr={cfg.lr} must be > 0")
    for option, text, valid in (("modes", cfg.modes, MODES),
                                ("normalisations", cfg.normalisations, NORMALISATIONS)):
        bad = [v for v in _names(text) if v not in valid]
        if bad or not _names(text):
            errors.append(f"--{option}={text!r}: choose from {', '.join(valid)}")
    return errors


def _names(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


@dataclass(frozen=True)
class Trajectory:
    """One simulation's outcome per setting ``[S]``: the drift step n (capped), q̄ at n,
    whether 2q₀ was reached, the conversion step (capped) and whether q̄ ≥ 0.5 was reached."""

    drift_steps_S: torch.Tensor
    drift_q_S: torch.Tensor
    drift_reached_S: torch.Tensor
    conversion_steps_S: torch.Tensor
    converted_S: torch.Tensor


def group_advantages(rewards_SNK: torch.Tensor, normalisation: str) -> torch.Tensor:
    """A over the last dimension (the group): r − mean (``mean``), or the population z-score,
    0 where the std ≤ 1e-8 (``std``)."""
    centred = rewards_SNK - rewards_SNK.mean(-1, keepdim=True)
    if normalisation == "mean":
        return centred
    std = rewards_SNK.std(-1, unbiased=False, keepdim=True)
    return torch.where(std > STD_EPS, centred / std.clamp_min(STD_EPS),
                       torch.zeros_like(centred))


def success_q(logits_SNDb: torch.Tensor, depth_mask_SND: torch.Tensor) -> torch.Tensor:
    """Exact q per prompt ``[S, N]``: Π over the prompt's decisions of π(action 0)."""
    p_SND = logits_SNDb.softmax(-1)[..., 0]
    return torch.where(depth_mask_SND, p_SND, torch.ones_like(p_SND)).prod(-1)


def policy_gradient_step(logits_SNDb: torch.Tensor, depth_mask_SND: torch.Tensor,
                         group_size: int, normalisation: str, lr: float,
                         generator: torch.Generator) -> None:
    """One group per prompt, one SGD step on −(1/(N·K)) Σ A Σ_t log π(a_t), in place."""
    S, N, D, b = logits_SNDb.shape
    probs_SNDb = logits_SNDb.softmax(-1)
    u = torch.rand(S, N, group_size, D, 1, generator=generator, device=logits_SNDb.device)
    cdf = probs_SNDb.cumsum(-1)[:, :, None]
    actions_SNKD = (u > cdf).sum(-1).clamp_max(b - 1)
    mask_SNKD = depth_mask_SND[:, :, None].expand(-1, -1, group_size, -1)
    correct_SNKD = (actions_SNKD == 0) | ~mask_SNKD
    alive_SNKD = correct_SNKD.float().cumprod(-1)
    before_SNKD = torch.cat([torch.ones_like(alive_SNKD[..., :1]), alive_SNKD[..., :-1]], -1)
    valid_SNKD = before_SNKD * mask_SNKD.float()
    rewards_SNK = correct_SNKD.all(-1).float()
    adv_SNK = group_advantages(rewards_SNK, normalisation)
    w_SNKD = adv_SNK[..., None] * valid_SNKD / (N * group_size)
    logits_SNDb.sub_(lr * score_loss_grad(probs_SNDb, actions_SNKD, w_SNKD))


def score_loss_grad(probs_SNDb: torch.Tensor, actions_SNKD: torch.Tensor,
                    w_SNKD: torch.Tensor) -> torch.Tensor:
    """∂/∂logits of −Σ_{k,d} w_{k,d} log π(a_{k,d}) for softmax tables: −Σ_k w (onehot(a) − π),
    ``[S, N, D, b]``."""
    onehot_SNDb = torch.zeros_like(probs_SNDb).scatter_add_(
        -1, actions_SNKD.transpose(2, 3), w_SNKD.transpose(2, 3))
    return -(onehot_SNDb - probs_SNDb * w_SNKD.sum(2)[..., None])


def simulate(q0_S: torch.Tensor, depth_SN: torch.Tensor, cfg: DriftConfig, group_size: int,
             normalisation: str, generator: torch.Generator) -> Trajectory:
    """Run every setting (row of ``q0_S``, prompts of depths ``depth_SN``) until q̄ ≥ 0.5 or
    ``conversion_max_steps``; drift and conversion steps per setting."""
    device = q0_S.device
    S, N = depth_SN.shape
    d_max = int(depth_SN.max())
    depth_mask_SND = torch.arange(d_max, device=device) < depth_SN[..., None]
    p0_SN = q0_S[:, None].double().pow(1.0 / depth_SN.double()).float()
    b = cfg.branching
    target_SN = torch.log(p0_SN * (b - 1) / (1 - p0_SN))
    logits_SNDb = torch.zeros(S, N, d_max, b, device=device)
    logits_SNDb[..., 0] = target_SN[..., None].expand(-1, -1, d_max)
    big = cfg.conversion_max_steps
    drift_steps = torch.full((S,), cfg.drift_max_steps, device=device)
    drift_q = torch.zeros(S, device=device)
    drift_reached = torch.zeros(S, dtype=torch.bool, device=device)
    conversion = torch.full((S,), big, device=device)
    converted = torch.zeros(S, dtype=torch.bool, device=device)
    active_A = torch.arange(S, device=device)  # settings still running (finished ones leave)
    for step in range(1, big + 1):
        policy_gradient_step(logits_SNDb, depth_mask_SND, group_size, normalisation, cfg.lr,
                             generator)
        q_A = success_q(logits_SNDb, depth_mask_SND).mean(-1)
        if step <= cfg.drift_max_steps:
            hit = ~drift_reached[active_A] & (q_A >= 2 * q0_S[active_A])
            last = ~drift_reached[active_A] & (step == cfg.drift_max_steps)
            drift_steps[active_A[hit]] = step
            drift_q[active_A[hit | last]] = q_A[hit | last]
            drift_reached[active_A[hit]] = True
        hit = ~converted[active_A] & (q_A >= 0.5)
        conversion[active_A[hit]] = step
        converted[active_A[hit]] = True
        done_A = converted[active_A] & (drift_reached[active_A] | (step >= cfg.drift_max_steps))
        if bool(done_A.any()):
            keep_A = ~done_A
            active_A, logits_SNDb = active_A[keep_A], logits_SNDb[keep_A]
            depth_mask_SND = depth_mask_SND[keep_A]
            if active_A.numel() == 0:
                break
    return Trajectory(drift_steps, drift_q, drift_reached, conversion, converted)


def run_drift(cfg: DriftConfig) -> ProbeResult:
    """Every (mode, K, normalisation): one batched simulation over q₀ levels × seeds."""
    errors = drift_errors(cfg)
    if errors:
        raise ValueError("; ".join(errors))
    device = torch.device(cfg.device)
    q0s = [2.0 ** -i for i in range(1, cfg.q0_halvings + 1)]
    seeds = list(range(cfg.seed, cfg.seed + cfg.num_seeds))
    rows: list[Row] = []
    for mode in _names(cfg.modes):
        for k in parse_ints(cfg.group_sizes, "--group_sizes"):
            for norm in _names(cfg.normalisations):
                q0_S = torch.tensor([q for _ in seeds for q in q0s], device=device)
                depth_SN = _depths(mode, cfg, seeds, len(q0s), device)
                generator = torch.Generator(device=device).manual_seed(
                    cfg.seed * 100_003 + MODES.index(mode) * 10_007 + k * 11
                    + NORMALISATIONS.index(norm))
                traj = simulate(q0_S, depth_SN, cfg, k, norm, generator)
                for s in range(q0_S.shape[0]):
                    seed, q0 = seeds[s // len(q0s)], q0s[s % len(q0s)]
                    n = float(traj.drift_steps_S[s])
                    rows.append({
                        "mode": mode, "group_size": k, "normalisation": norm, "seed": seed,
                        "q0": q0, "drift": (float(traj.drift_q_S[s]) - q0) / n,
                        "drift_steps": int(n),
                        "drift_reached": int(traj.drift_reached_S[s]),
                        "conversion_steps": int(traj.conversion_steps_S[s]),
                        "converted": int(traj.converted_S[s])})
    return ProbeResult(rows=rows, summary=summarise(rows, cfg))


def _depths(mode: str, cfg: DriftConfig, seeds: list[int], n_q0: int,
            device: torch.device) -> torch.Tensor:
    """``[S, N]`` depths: D everywhere (homogeneous) or uniform in 1..mixture_max_depth, drawn
    per seed and shared by that seed's q₀ levels (mixture)."""
    if mode == "homogeneous":
        return torch.full((len(seeds) * n_q0, cfg.num_prompts), cfg.depth, device=device)
    per_seed = [torch.randint(1, cfg.mixture_max_depth + 1, (cfg.num_prompts,),
                              generator=torch.Generator().manual_seed(seed))
                for seed in seeds]
    return torch.stack([d for d in per_seed for _ in range(n_q0)]).to(device)


def _seed_mean(rows: list[Row], key: str, **where: object) -> dict[float, float]:
    """q₀ → mean over seeds of ``key`` among the rows matching ``where``."""
    out: dict[float, list[float]] = {}
    for r in rows:
        if all(r[k] == v for k, v in where.items()):
            out.setdefault(float(r["q0"]), []).append(float(r[key]))
    return {q: mean(v) for q, v in sorted(out.items(), reverse=True)}


def summarise(rows: list[Row], cfg: DriftConfig) -> str:
    """The Markdown summary: slopes, std/mean ratios and conversion ratios per halving."""
    lines = ["# learnability_drift", "",
             f"N = {cfg.num_prompts} prompts, b = {cfg.branching}, lr = {cfg.lr} (plain SGD), "
             f"seeds {cfg.num_seeds}; drift = (q̄_n − q₀)/n at the first step with q̄ ≥ 2q₀ "
             f"(≤ {cfg.drift_max_steps}); conversion = first step with q̄ ≥ 0.5 "
             f"(≤ {cfg.conversion_max_steps}). Seed means.", ""]
    slope_rows, ratio_rows = [], []
    modes = _names(cfg.modes)
    norms = _names(cfg.normalisations)
    for mode in modes:
        for k in parse_ints(cfg.group_sizes, "--group_sizes"):
            for norm in norms:
                drift = _seed_mean(rows, "drift", mode=mode, group_size=k, normalisation=norm)
                conv = _seed_mean(rows, "conversion_steps", mode=mode, group_size=k,
                                  normalisation=norm)
                converted = _seed_mean(rows, "converted", mode=mode, group_size=k,
                                       normalisation=norm)
                cold = [q for q in drift if q <= SLOPE_MAX_Q0]
                slope = loglog_slope(cold, [drift[q] for q in cold])
                qs = [q for q in conv if converted[q] == 1.0 and q <= SLOPE_MAX_Q0]
                halvings = [conv[b] / conv[a] for a, b in itertools.pairwise(qs)
                            if math.isclose(b, a / 2)]
                slope_rows.append((mode, k, norm, slope, geometric_mean(halvings),
                                   loglog_slope(qs, [conv[q] for q in qs]), len(qs),
                                   len(cold)))
            if set(NORMALISATIONS) <= set(norms):
                d_mean = _seed_mean(rows, "drift", mode=mode, group_size=k, normalisation="mean")
                d_std = _seed_mean(rows, "drift", mode=mode, group_size=k, normalisation="std")
                ratio = geometric_mean([d_std[q] / d_mean[q] for q in d_mean
                                        if q <= SLOPE_MAX_Q0 and d_mean[q] > 0])
                ratio_rows.append((mode, k, ratio, math.sqrt(k), ratio / math.sqrt(k)))
    lines += ["## Slope of log drift on log q₀ and conversion time per halving (q₀ ≤ 0.1)", "",
              "Conversion: the geometric mean of T(q₀/2)/T(q₀) over consecutive converted "
              "levels, and the slope of log T on log q₀ (−1 = doubling per halving).", "",
              markdown_table(("mode", "K", "normalisation", "drift slope", "conversion ratio "
                              "per halving", "conversion slope", "q₀ converted",
                              "q₀ levels"), slope_rows)]
    if ratio_rows:
        lines += ["## std/mean drift ratio (geometric mean over q₀ ≤ 0.1)", "",
                  markdown_table(("mode", "K", "std/mean", "√K", "ratio/√K"), ratio_rows)]
    lines += ["Questions: slope 2 (dq/dt ∝ q²)? std/mean ratio ∝ √K? conversion time doubling "
              "per halving (ratio 2)?", ""]
    return "\n".join(lines)
