"""Probe ``opd_variance`` (COMPANIONS.md §1): how the variance of three OPD gradient
estimators scales with the horizon H.

Per seed and H: a random, never-trained TinyTransformer (d_model 32, 1 layer, 2 heads, content
alphabet V = 2, max length 2H + 1), token_reversal with seq_len H, the oracle teacher (ε =
1e-3) and a fixed random unit direction u over all parameters. For each of ``num_batches``
batches of B student rollouts (temperature 1), with r_t = sg(log π_T(a_t) − ℓ(a_t)), on the
**same** rollouts:

- ``sequence_pg``: g = −(1/B) Σ_b Σ_t R_{b,t} ∇ℓ_{b,t}, R_t = Σ_{s≥t} r_s;
- ``token_pg``: g = −(1/(B·H)) Σ_{b,t} r_{b,t} ∇ℓ_{b,t} (γ = 0, token mean, as ``opd_pg``);
- ``full_vocab_rkl``: g = ∇ (1/(B·H)) Σ_{b,t} KL_t (exact reverse KL to the teacher).

The probe records Var over batches of uᵀg (population variance), writes ``opd_variance.csv``
(a row per seed, H and estimator) and ``summary.md`` (seed means per (H, estimator) and the
least-squares slope of log Var on log H per estimator).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rlscope.methods.opd import reverse_kl_terms_BTV
from rlscope.methods.teacher import oracle_logp_BTV
from rlscope.policy.tiny import TinyConfig, TinyTransformer
from rlscope.probes.base import ProbeResult
from rlscope.sampling.sampler import SamplingConfig, generate
from rlscope.tasks import TaskConfig, make_task

ESTIMATORS = ("sequence_pg", "token_pg", "full_vocab_rkl")
"""The gradient estimators compared, in table order."""


@dataclass(frozen=True)
class OpdVarianceConfig:
    """``rlscope probe opd_variance``: variance of OPD gradient estimators against horizon."""

    horizons: tuple[int, ...] = (4, 8, 16, 32)
    """Horizons H (token_reversal seq_len), each >= 1; the evidence setting adds 64."""
    num_batches: int = 40
    """Batches of student rollouts per seed and H (the variance is over them; >= 2)."""
    batch_size: int = 16
    """Rollouts B per batch (>= 1)."""
    num_seeds: int = 3
    """Seeds 0..num_seeds−1: each a new random student and direction u (>= 1)."""
    teacher_epsilon: float = 1e-3
    """ε of the oracle teacher, in (0, 1)."""
    out_dir: str = "probes/opd_variance"
    """Directory for opd_variance.csv and summary.md (created)."""

    def errors(self) -> list[str]:
        """Every reason the configuration cannot run, each naming the flag to change."""
        errors = []
        if not self.horizons or min(self.horizons) < 1:
            errors.append(f"--horizons {list(self.horizons)}: give one or more horizons >= 1")
        if self.num_batches < 2:
            errors.append(f"--num_batches {self.num_batches} must be >= 2 (a variance)")
        if self.batch_size < 1 or self.num_seeds < 1:
            errors.append("--batch_size and --num_seeds must be >= 1")
        if not 0 < self.teacher_epsilon < 1:
            errors.append(f"--teacher_epsilon {self.teacher_epsilon} must lie in (0, 1)")
        return errors


def _directional(loss: torch.Tensor, params: list[torch.Tensor], u_list: list[torch.Tensor]
                 ) -> float:
    """uᵀ∇loss over all parameters."""
    grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    return float(sum((g * u).sum() for g, u in zip(grads, u_list, strict=True)
                     if g is not None))


def estimator_projections(horizon: int, seed: int, num_batches: int, batch_size: int,
                          epsilon: float) -> dict[str, list[float]]:
    """uᵀg of each estimator on each of ``num_batches`` batches, for one seed and H."""
    torch.manual_seed(seed)
    task = make_task("token_reversal", TaskConfig(vocab=2, seq_len=horizon))
    policy = TinyTransformer(TinyConfig(vocab_size=task.vocab_size, max_len=2 * horizon + 1,
                                        d_model=32, n_heads=2, n_layers=1))
    params: list[torch.Tensor] = [p for p in policy.parameters() if p.requires_grad]
    g = torch.Generator().manual_seed(seed * 1_000_003 + horizon)
    u_list = [torch.randn(p.shape, generator=g) for p in params]
    norm = math.sqrt(sum(float(u.square().sum()) for u in u_list))
    u_list = [u / norm for u in u_list]
    out: dict[str, list[float]] = {name: [] for name in ESTIMATORS}
    for _ in range(num_batches):
        prompts = task.sample_prompts(g, batch_size)
        seeds_B = torch.randint(0, 2**62, (batch_size,), generator=g)
        policy.eval()
        rollout = generate(policy, prompts, SamplingConfig(temperature=1.0), seeds_B, horizon)
        tokens_BT = rollout.completion_tokens_BT
        full_BL = torch.cat([rollout.prompt_tokens_BP, tokens_BT], 1)
        logits_BLV, _ = policy.forward(full_BL, None)
        P = rollout.prompt_len
        student_BTV = logits_BLV[:, P - 1:P - 1 + horizon].float().log_softmax(-1)
        assert rollout.targets_BT is not None
        teacher_BTV = oracle_logp_BTV(rollout.targets_BT, task.vocab_size, epsilon)
        logp_BT = student_BTV.gather(-1, tokens_BT[..., None]).squeeze(-1)
        r_BT = (teacher_BTV.gather(-1, tokens_BT[..., None]).squeeze(-1) - logp_BT).detach()
        R_BT = r_BT.flip(-1).cumsum(-1).flip(-1)  # R_t = Σ_{s≥t} r_s
        B, H = tokens_BT.shape
        losses = {
            "sequence_pg": -(R_BT * logp_BT).sum() / B,
            "token_pg": -(r_BT * logp_BT).sum() / (B * H),
            "full_vocab_rkl": reverse_kl_terms_BTV(student_BTV, teacher_BTV).sum() / (B * H),
        }
        for name, loss in losses.items():
            out[name].append(_directional(loss, params, u_list))
    return out


def variance(values: list[float]) -> float:
    """Population variance (ddof 0) over the batches."""
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / len(values)


def loglog_slope(horizons: list[int], variances: list[float]) -> float:
    """Least-squares slope b of log Var = a + b log H (nan with fewer than two points or a
    non-positive variance)."""
    if len(horizons) < 2 or min(variances) <= 0:
        return math.nan
    x = [math.log(h) for h in horizons]
    y = [math.log(v) for v in variances]
    mx, my = sum(x) / len(x), sum(y) / len(y)
    sxx = sum((a - mx) ** 2 for a in x)
    return sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True)) / sxx


def run(cfg: OpdVarianceConfig) -> ProbeResult:
    """Measure every (seed, H, estimator): the rows and the summary (`rlscope.probes.run_probe`
    writes opd_variance.csv and summary.md). ValueError naming the flags when ``cfg`` cannot
    run."""
    if errors := cfg.errors():
        raise ValueError("; ".join(errors))
    rows: list[dict[str, float | int | str]] = []
    for seed in range(cfg.num_seeds):
        for horizon in cfg.horizons:
            proj = estimator_projections(horizon, seed, cfg.num_batches, cfg.batch_size,
                                         cfg.teacher_epsilon)
            for name in ESTIMATORS:
                rows.append({"seed": seed, "horizon": horizon, "estimator": name,
                             "variance": variance(proj[name]),
                             "mean": sum(proj[name]) / len(proj[name]),
                             "num_batches": cfg.num_batches, "batch_size": cfg.batch_size})
    return ProbeResult(rows, summary_markdown(rows, list(cfg.horizons)))


def summary_markdown(rows: list[dict[str, float | int | str]], horizons: list[int]) -> str:
    """Seed means of Var(uᵀg) per (H, estimator) and each estimator's log–log slope on H."""
    means: dict[tuple[str, int], float] = {}
    for name in ESTIMATORS:
        for h in horizons:
            vals = [float(r["variance"]) for r in rows
                    if r["estimator"] == name and r["horizon"] == h]
            means[name, h] = sum(vals) / len(vals)
    lines = ["# opd_variance: Var over batches of uᵀg (seed means)", "",
             "| estimator | " + " | ".join(f"H = {h}" for h in horizons) + " | slope |",
             "| --- | " + " | ".join("---" for _ in horizons) + " | --- |"]
    for name in ESTIMATORS:
        slope = loglog_slope(horizons, [means[name, h] for h in horizons])
        lines.append(f"| {name} | " + " | ".join(f"{means[name, h]:.4g}" for h in horizons)
                     + f" | {slope:.3f} |")
    return "\n".join(lines) + "\n"
