"""Update rules as data: the literal preset registry `METHODS` and component overrides.

A preset is a `MethodSpec` (one component per axis). ``resolve_method(name, MethodConfig)``
looks a preset up (case-insensitive; CamelCase aliases such as ``DrGRPO`` work) and applies
command-line overrides (``--method grpo --advantage group_center`` is the Dr. GRPO ablation).
``validate_method`` rejects configurations outside a method's valid regime.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TypeVar

from rlscope.methods.advantages import ADVANTAGES, GROUPED_ADVANTAGES
from rlscope.methods.aggregation import AGGREGATIONS
from rlscope.methods.corrections import CORRECTIONS, CorrectionConfig
from rlscope.methods.gates import GATES
from rlscope.methods.objectives import OBJECTIVES
from rlscope.methods.regularizers import KL_ESTIMATORS
from rlscope.methods.selection import OVERLONG, SELECTIONS
from rlscope.methods.spec import (
    AdvantageConfig,
    EntropyConfig,
    GateConfig,
    KLConfig,
    MethodSpec,
    ObjectiveConfig,
    OverlongConfig,
    ValueConfig,
)
from rlscope.methods.tpo import OBJECTIVE_AGG

_GRPO_KL = KLConfig(coef=0.04, estimator="k3", target="behaviour", place="loss")

METHODS: dict[str, MethodSpec] = {
    "ce": MethodSpec(
        description="Cross-entropy on the ground truth: a supervised upper bound.",
        source="supervised learning", regime="tasks with ground-truth labels",
        advantage=AdvantageConfig("zero"), objective=ObjectiveConfig("ce_oracle")),
    "reinforce": MethodSpec(
        description="REINFORCE with the expected-reward baseline.",
        source="Williams 1992", regime="on-policy",
        advantage=AdvantageConfig("expected"), objective=ObjectiveConfig("score")),
    "pg": MethodSpec(
        description="Policy gradient with a capped per-token importance weight.",
        source="importance-weighted PG", regime="on- or slightly off-policy",
        advantage=AdvantageConfig("expected"), objective=ObjectiveConfig("is_capped", cap=10.0)),
    "ppo": MethodSpec(
        description="PPO with a value head, GAE, value clipping, adaptive KL in the reward.",
        source="Schulman et al. 1707.06347; Ziegler et al. 1909.08593",
        regime="any task; needs a critic",
        advantage=AdvantageConfig("gae", gamma=1.0, lam=0.95),
        objective=ObjectiveConfig("ppo_clip", clip_low=0.2, clip_high=0.2),
        kl=KLConfig(coef=0.2, estimator="k1", target="ref", place="reward", control="adaptive"),
        value=ValueConfig(coef=0.1, clip=0.2)),
    "grpo": MethodSpec(
        description="Group z-scored advantages, PPO clip, k3 KL to the behaviour policy.",
        source="Shao et al. 2402.03300", regime="grouped sampling, group_size > 1",
        advantage=AdvantageConfig("group_zscore"), objective=ObjectiveConfig("ppo_clip"),
        kl=_GRPO_KL, selection="mixed_groups", grouped=True),
    "dr_grpo": MethodSpec(
        description="GRPO without std normalisation, sequence-mean of token sums.",
        source="Liu et al. 2503.20783", regime="grouped sampling, group_size > 1",
        advantage=AdvantageConfig("group_center"), objective=ObjectiveConfig("ppo_clip"),
        agg="seq_mean_token_sum", kl=_GRPO_KL, selection="mixed_groups", grouped=True),
    "dapo": MethodSpec(
        description="Clip-higher, token-mean loss, mixed groups, no KL, overlong shaping.",
        source="Yu et al. 2503.14476", regime="grouped sampling; no KL term",
        advantage=AdvantageConfig("group_zscore"),
        objective=ObjectiveConfig("ppo_clip", clip_low=0.2, clip_high=0.28),
        selection="mixed_groups", overlong=OverlongConfig("penalty"), grouped=True,
        requires=("no_kl",)),
    "rloo": MethodSpec(
        description="Leave-one-out baseline with the PPO clip.",
        source="Ahmadian et al. 2402.14740", regime="grouped sampling, group_size > 1",
        advantage=AdvantageConfig("rloo"), objective=ObjectiveConfig("ppo_clip"),
        selection="mixed_groups", grouped=True),
    "dg": MethodSpec(
        description="Delightful policy gradient: advantage × sigmoid(advantage × surprisal).",
        source="delight-gradient sandbox", regime="on-policy; any task",
        advantage=AdvantageConfig("expected"), gate=GateConfig("delight", eta=1.0),
        objective=ObjectiveConfig("score")),
    "kondo": MethodSpec(
        description="DG on the samples that Kondo screening keeps by their delight.",
        source="delight-gradient sandbox (Kondo screening)",
        regime="ungrouped batches (group_size 1); 0 < keep_ratio <= 1",
        advantage=AdvantageConfig("expected"), gate=GateConfig("delight", eta=1.0),
        objective=ObjectiveConfig("score"), selection="kondo", keep_ratio=0.5),
    "traj_pg": MethodSpec(
        description="Policy gradient with a capped sequence-level importance weight.",
        source="importance-weighted PG", regime="on- or slightly off-policy",
        advantage=AdvantageConfig("expected"),
        objective=ObjectiveConfig("traj_is_capped", cap=10.0)),
    "gspo": MethodSpec(
        description="Group z-scores with one clipped ratio per sequence (geometric mean).",
        source="Zheng et al. 2507.18071", regime="grouped sampling, group_size > 1",
        advantage=AdvantageConfig("group_zscore"),
        objective=ObjectiveConfig("gspo", clip_low=3e-4, clip_high=4e-4),
        agg="seq_mean_token_mean", selection="mixed_groups", grouped=True),
    "cispo": MethodSpec(
        description="Clipped importance weights as coefficients; no token's gradient is zeroed.",
        source="MiniMax-M1 2506.13585", regime="grouped sampling, group_size > 1",
        advantage=AdvantageConfig("group_zscore"), objective=ObjectiveConfig("cispo"),
        selection="mixed_groups", grouped=True),
    "sapo": MethodSpec(
        description="Soft, sigmoid-gated trust region instead of a hard clip.",
        source="SAPO (soft adaptive policy optimisation)", regime="grouped sampling",
        advantage=AdvantageConfig("group_zscore"), objective=ObjectiveConfig("sapo"),
        selection="mixed_groups", grouped=True),
    "reinforce_pp": MethodSpec(
        description="REINFORCE++: group-mean baseline, batch-whitened returns, PPO clip.",
        source="Hu 2501.03262", regime="grouped sampling",
        advantage=AdvantageConfig("reinforce_pp_baseline"), objective=ObjectiveConfig("ppo_clip"),
        selection="mixed_groups", grouped=True),
    "replay_dg": MethodSpec(
        description="DG trained on batches drawn from a replay buffer.",
        source="delight-gradient sandbox", regime="needs a replay buffer",
        advantage=AdvantageConfig("expected"), gate=GateConfig("delight"),
        objective=ObjectiveConfig("score"), requires=("replay",)),
    "fresh_dg": MethodSpec(
        description="DG whose weights decay with the batch's age.",
        source="delight-gradient sandbox", regime="needs staleness (delay or replay)",
        advantage=AdvantageConfig("expected"), gate=GateConfig("freshness"),
        objective=ObjectiveConfig("score"), requires=("staleness",)),
    "dg_entropy_guard": MethodSpec(
        description="DG that damps positive updates on already-likely tokens.",
        source="delight-gradient sandbox", regime="any task",
        advantage=AdvantageConfig("expected"), gate=GateConfig("entropy_guard"),
        objective=ObjectiveConfig("score")),
    "uncertainty_dg": MethodSpec(
        description="DG whose gate is shifted down by the reward's spread.",
        source="delight-gradient sandbox", regime="noisy rewards",
        advantage=AdvantageConfig("expected"), gate=GateConfig("uncertainty_shift"),
        objective=ObjectiveConfig("score")),
    "filtered_dg": MethodSpec(
        description="DG that drops samples whose reward spread exceeds a threshold.",
        source="delight-gradient sandbox", regime="noisy rewards",
        advantage=AdvantageConfig("expected"), gate=GateConfig("uncertainty_filter"),
        objective=ObjectiveConfig("score")),
    "reward_variance_dg": MethodSpec(
        description="DG with advantages shrunk by the reward's spread.",
        source="delight-gradient sandbox", regime="noisy rewards",
        advantage=AdvantageConfig("expected"), gate=GateConfig("uncertainty_shrink"),
        objective=ObjectiveConfig("score")),
    "dg_token": MethodSpec(
        description="DG with token-level return-to-go credit.",
        source="delight-gradient sandbox",
        regime="token tasks with clean, non-binary, decomposable rewards",
        advantage=AdvantageConfig("rtg"), gate=GateConfig("delight"),
        objective=ObjectiveConfig("score"), requires=("token_rewards",)),
    "aspo": MethodSpec(
        description="Asymmetric importance weights: μ/π for gains, π/μ for losses.",
        source="ASPO", regime="any task; reduces to REINFORCE on-policy",
        advantage=AdvantageConfig("expected"),
        objective=ObjectiveConfig("aspo", clip_low=0.2, clip_high=0.28)),
    "r2vpo": MethodSpec(
        description="Ratio-variance-penalised policy gradient, differentiated through ρ.",
        source="R2VPO", regime="any task; reduces to REINFORCE on-policy",
        advantage=AdvantageConfig("expected"), objective=ObjectiveConfig("r2vpo")),
    "tempo": MethodSpec(
        description="Prefix-tree values within a group as token-level credit.",
        source="TEMPO", regime="grouped sampling",
        advantage=AdvantageConfig("tempo"), objective=ObjectiveConfig("is_capped", cap=10.0),
        selection="mixed_groups", grouped=True),
    "remax": MethodSpec(
        description="REINFORCE with the reward of the prompt's greedy rollout as baseline.",
        source="ReMax, Li et al. 2310.10505", regime="any task; one extra greedy decode per "
        "prompt",
        advantage=AdvantageConfig("remax"), objective=ObjectiveConfig("score")),
    "maxrl": MethodSpec(
        description="Group advantages normalised by the group's mean reward.",
        source="MaxRL", regime="binary rewards with groups, no reward noise",
        advantage=AdvantageConfig("maxrl"), objective=ObjectiveConfig("is_capped", cap=10.0),
        selection="mixed_groups", grouped=True, requires=("binary_rewards", "clean_rewards")),
    "log_growth": MethodSpec(
        description="Kelly-style log-growth weights: successes weighted by 1/π(a).",
        source="log-growth policy gradient", regime="binary bandits, no KL, no reward noise",
        advantage=AdvantageConfig("expected"), objective=ObjectiveConfig("log_growth"),
        requires=("bandit", "binary_rewards", "clean_rewards", "no_kl")),
    "pmd_mean": MethodSpec(
        description="Policy mirror descent: regress τ·log-ratio onto the reward's surplus.",
        source="PMD-mean", regime="any task; off-policy capable",
        advantage=AdvantageConfig("zero"), objective=ObjectiveConfig("pmd_mean"),
        agg="seq_mean_token_sum"),
    "tpo": MethodSpec(
        description="Fit a soft target over the group: behaviour anchor tilted by skill.",
        source="Target Policy Optimisation (TPO sandbox)",
        regime="grouped sampling, group_size > 1",
        advantage=AdvantageConfig("group_zscore"), objective=ObjectiveConfig("tpo"),
        agg="seq_mean_token_sum", selection="mixed_groups", grouped=True),
    "tpo_no_anchor": MethodSpec(
        description="TPO ablation: the target is softmax(skill/η), no behaviour anchor.",
        source="Target Policy Optimisation (TPO sandbox)",
        regime="grouped sampling, group_size > 1",
        advantage=AdvantageConfig("group_zscore"), objective=ObjectiveConfig("tpo_no_anchor"),
        agg="seq_mean_token_sum", selection="mixed_groups", grouped=True),
    "group_pg": MethodSpec(
        description="TPO's skill weights as a plain group policy gradient (no soft target).",
        source="Target Policy Optimisation (TPO sandbox)",
        regime="grouped sampling, group_size > 1",
        advantage=AdvantageConfig("group_zscore"), objective=ObjectiveConfig("group_pg"),
        agg="seq_mean_token_sum", selection="mixed_groups", grouped=True),
    "tpo_full_action": MethodSpec(
        description="TPO over every action of a bandit: soft target from one sampled class.",
        source="Target Policy Optimisation (TPO sandbox)",
        regime="bandit tasks, on-policy, one inner epoch, clean rewards",
        advantage=AdvantageConfig("zero"), objective=ObjectiveConfig("tpo_full_action"),
        requires=("bandit", "on_policy", "single_epoch", "clean_rewards")),
    "tpo_token": MethodSpec(
        description="TPO per prefix over K next-token candidates with dense rewards.",
        source="Target Policy Optimisation (TPO sandbox)",
        regime="token tasks with clean, decomposable rewards; K = group_size > 1; on-policy",
        advantage=AdvantageConfig("zero"), objective=ObjectiveConfig("tpo_token"),
        grouped=True, requires=("token_rewards", "on_policy")),
    "grpo_token": MethodSpec(
        description="GRPO per prefix over K next-token candidates with dense rewards.",
        source="TPO sandbox (the GRPO control of tpo_token)",
        regime="token tasks with clean, decomposable rewards; K = group_size > 1; on-policy",
        advantage=AdvantageConfig("zero"),
        objective=ObjectiveConfig("grpo_token", clip_low=0.2, clip_high=0.2, candidate_kl=0.04),
        grouped=True, requires=("token_rewards", "on_policy")),
    "self_distill_dg": MethodSpec(
        description="DG on a token oracle advantage plus gated label cross-entropy.",
        source="delight-gradient sandbox", regime="sequence tasks with per-token labels",
        advantage=AdvantageConfig("oracle_token"), gate=GateConfig("delight"),
        objective=ObjectiveConfig("self_distill"), requires=("token_labels",)),
    "scope_lite": MethodSpec(
        description="DG plus label cross-entropy from each failure's first wrong token on.",
        source="delight-gradient sandbox (SCOPE, lite)",
        regime="sequence tasks with per-token labels",
        advantage=AdvantageConfig("expected"), gate=GateConfig("delight"),
        objective=ObjectiveConfig("scope_lite"), requires=("token_labels",)),
}


def _key(name: str) -> str:
    return name.replace("_", "").replace("-", "").lower()


_LOOKUP = {_key(name): name for name in METHODS}


def canonical_method_name(name: str) -> str:
    """The registry key for ``name`` (case-insensitive, CamelCase aliases), or ValueError."""
    try:
        return _LOOKUP[_key(name)]
    except KeyError:
        raise ValueError(
            f"unknown method {name!r}; valid methods: {', '.join(METHODS)}") from None


@dataclass(frozen=True)
class MethodConfig:
    """Per-component overrides of the chosen preset (unset = the preset's value)."""

    advantage: str | None = None
    """Override the advantage estimator (e.g. group_center, rloo, expected, gae)."""
    gate: str | None = None
    """Override the influence gate (none, delight)."""
    objective: str | None = None
    """Override the objective (score, is_capped, ppo_clip, ce_oracle)."""
    agg: str | None = None
    """Override the token aggregation (token_mean, seq_mean_token_mean, seq_mean_token_sum,
    seq_mean_token_sum_norm, sum)."""
    selection: str | None = None
    """Override sample selection (none, mixed_groups, kondo)."""
    keep_ratio: float | None = None
    """kondo selection: mean keep probability, in (0, 1] (1 keeps every sample)."""
    overlong: str | None = None
    """Truncated completions: none, mask (drop from the loss) or penalty (DAPO's soft length
    penalty); needs completions that can stop early (--stop_token_ids)."""
    overlong_buffer: int | None = None
    """L_buf of the overlong penalty in tokens (0 = max(1, L_max // 4))."""
    overlong_factor: float | None = None
    """Overlong penalty at |y| = L_max (>= 0)."""
    eta: float | None = None
    """Delight gate temperature η (> 0)."""
    uncertainty_scale: float | None = None
    """Scale s of the uncertainty_shift / uncertainty_shrink gates."""
    filter_tau: float | None = None
    """Reward-spread threshold τ of the uncertainty_filter gate."""
    guard_scale: float | None = None
    """Scale s of the entropy_guard gate."""
    cispo_max: float | None = None
    """CISPO importance-weight cap ε_max (> 0)."""
    r2vpo_lambda: float | None = None
    """R2VPO ratio-variance penalty λ (>= 0)."""
    dro_beta: float | None = None
    """DRO squared log-ratio penalty β (>= 0)."""
    tpo_eta: float | None = None
    """TPO-family temperature η of the soft target (> 0)."""
    candidate_kl: float | None = None
    """grpo_token: k3 penalty β to the candidates' behaviour log-probs (>= 0)."""
    distill_alpha: float | None = None
    """self_distill_dg / scope_lite: weight α of the label cross-entropy (>= 0)."""
    is_correction: str | None = None
    """Sampler-vs-learner correction: none, token_truncate, token_mask, sequence_truncate,
    sequence_mask."""
    is_correction_cap: float | None = None
    """C of the truncate corrections: weight min(π_learner/π_sampler, C)."""
    is_band_low: float | None = None
    """C_min of the mask corrections: ratios below it are dropped."""
    is_band_high: float | None = None
    """C_max of the mask corrections: ratios above it are dropped."""
    is_geometric: bool | None = None
    """Sequence corrections use the geometric mean of token ratios."""
    clip_low: float | None = None
    """PPO ε_low (>= 0)."""
    clip_high: float | None = None
    """PPO ε_high (>= 0)."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1 (0 = off)."""
    is_cap: float | None = None
    """Importance-weight cap of is_capped (> 0)."""
    kl_coef: float | None = None
    """KL coefficient β (>= 0; 0 turns KL off)."""
    kl_estimator: str | None = None
    """KL estimator: k1, k2, k3, abs, or full (exact KL over the vocabulary; needs
    kl_target ref and kl_place loss)."""
    kl_target: str | None = None
    """KL target: ref (frozen initial policy) or behaviour (sampling policy)."""
    kl_place: str | None = None
    """Where KL acts: loss or reward."""
    kl_control: str | None = None
    """KL coefficient control: fixed, adaptive, or warmup (β = 0 for kl_warmup_steps steps,
    then kl_coef)."""
    kl_target_value: float | None = None
    """Adaptive KL controller target (nats per sequence)."""
    kl_horizon: float | None = None
    """Adaptive KL controller horizon (samples)."""
    kl_warmup_steps: int | None = None
    """Warm-up KL control: steps (from 0) with β = 0 before β = kl_coef (>= 0)."""
    entropy_coef: float | None = None
    """Entropy bonus coefficient c (loss −c·agg(H)); the initial c under adaptive control."""
    entropy_control: str | None = None
    """Entropy coefficient control: fixed, or adaptive (c ± entropy_delta per step towards
    entropy_target)."""
    entropy_target: float | None = None
    """Adaptive entropy control: target token-mean entropy (nats per token, >= 0)."""
    entropy_delta: float | None = None
    """Adaptive entropy control: step δ of c per trained step (> 0)."""
    entropy_window: int | None = None
    """Adaptive entropy control: trained steps whose mean entropy is compared to the target
    (>= 1)."""
    vf_coef: float | None = None
    """Value-loss weight (value-based methods)."""
    value_clip: float | None = None
    """Value clip range (0 = off)."""
    gamma: float | None = None
    """Discount γ for token-level advantages."""
    lam: float | None = None
    """GAE λ."""
    adv_std_floor: float | None = None
    """Clamp the group std from below before dividing (0 = off)."""
    adv_clip: float | None = None
    """Clamp |A| to this value (0 = off)."""


_C = TypeVar("_C", AdvantageConfig, GateConfig, ObjectiveConfig, KLConfig, ValueConfig,
             CorrectionConfig, OverlongConfig, EntropyConfig)


def _override(obj: _C, **changes: object) -> _C:
    set_changes = {k: v for k, v in changes.items() if v is not None}
    return dataclasses.replace(obj, **set_changes) if set_changes else obj  # type: ignore[arg-type]


def resolve_method(name: str, cfg: MethodConfig | None = None) -> MethodSpec:
    """The preset ``name`` with every set override of ``cfg`` applied."""
    spec = METHODS[canonical_method_name(name)]
    if cfg is None:
        return spec
    return dataclasses.replace(
        spec,
        advantage=_override(spec.advantage, name=cfg.advantage, gamma=cfg.gamma, lam=cfg.lam,
                            std_floor=cfg.adv_std_floor, clip=cfg.adv_clip),
        gate=_override(spec.gate, name=cfg.gate, eta=cfg.eta, s=cfg.uncertainty_scale,
                       tau=cfg.filter_tau, guard_scale=cfg.guard_scale),
        objective=_override(spec.objective, name=cfg.objective, clip_low=cfg.clip_low,
                            clip_high=cfg.clip_high, dual_clip=cfg.dual_clip, cap=cfg.is_cap,
                            cispo_max=cfg.cispo_max, r2vpo_lambda=cfg.r2vpo_lambda,
                            dro_beta=cfg.dro_beta, tpo_eta=cfg.tpo_eta,
                            candidate_kl=cfg.candidate_kl, distill_alpha=cfg.distill_alpha),
        agg=cfg.agg or spec.agg,
        kl=_override(spec.kl, coef=cfg.kl_coef, estimator=cfg.kl_estimator,
                     target=cfg.kl_target, place=cfg.kl_place, control=cfg.kl_control,
                     target_value=cfg.kl_target_value, horizon=cfg.kl_horizon,
                     warmup_steps=cfg.kl_warmup_steps),
        entropy_coef=spec.entropy_coef if cfg.entropy_coef is None else cfg.entropy_coef,
        entropy=_override(spec.entropy, control=cfg.entropy_control, target=cfg.entropy_target,
                          delta=cfg.entropy_delta, window=cfg.entropy_window),
        value=_override(spec.value, coef=cfg.vf_coef, clip=cfg.value_clip),
        selection=cfg.selection or spec.selection,
        keep_ratio=spec.keep_ratio if cfg.keep_ratio is None else cfg.keep_ratio,
        overlong=_override(spec.overlong, name=cfg.overlong, buffer=cfg.overlong_buffer,
                           factor=cfg.overlong_factor),
        correction=_override(spec.correction, name=cfg.is_correction, cap=cfg.is_correction_cap,
                             band_low=cfg.is_band_low, band_high=cfg.is_band_high,
                             geometric=cfg.is_geometric),
    )


def _choice(errors: list[str], field: str, value: str, valid: object) -> None:
    names = list(valid)  # type: ignore[call-overload]
    if value not in names:
        errors.append(f"method.{field}={value!r} is unknown; valid: {', '.join(names)}")


def validate_method(spec: MethodSpec, group_size: int, batch_size: int) -> list[str]:
    """Every reason this method cannot run as configured (empty when it can)."""
    errors: list[str] = []
    _choice(errors, "advantage", spec.advantage.name, ADVANTAGES)
    _choice(errors, "gate", spec.gate.name, GATES)
    _choice(errors, "objective", spec.objective.name, OBJECTIVES)
    _choice(errors, "agg", spec.agg, AGGREGATIONS)
    _choice(errors, "selection", spec.selection, SELECTIONS)
    _choice(errors, "overlong", spec.overlong.name, OVERLONG)
    _choice(errors, "kl_estimator", spec.kl.estimator, KL_ESTIMATORS)
    _choice(errors, "is_correction", spec.correction.name, CORRECTIONS)
    c = spec.correction
    if c.cap <= 0 or not 0 < c.band_low < c.band_high:
        errors.append("method.is_correction_cap must be > 0 and 0 < is_band_low < "
                      "is_band_high")
    _choice(errors, "kl_target", spec.kl.target, ("ref", "behaviour"))
    _choice(errors, "kl_place", spec.kl.place, ("loss", "reward"))
    _choice(errors, "kl_control", spec.kl.control, ("fixed", "adaptive", "warmup"))
    _choice(errors, "entropy_control", spec.entropy.control, ("fixed", "adaptive"))
    grouped = (spec.grouped or spec.advantage.name in GROUPED_ADVANTAGES
               or spec.selection == "mixed_groups" or spec.needs_whole_groups
               or spec.needs_candidates)
    own_agg = OBJECTIVE_AGG.get(spec.objective.name)
    if own_agg is not None and spec.agg != own_agg:
        errors.append(f"method.agg={spec.agg!r}: objective {spec.objective.name!r} is defined "
                      f"with agg={own_agg!r} (its loss is a mean over "
                      f"{'groups' if own_agg == 'seq_mean_token_sum' else 'prefixes'})")
    if grouped and group_size < 2:
        errors.append(f"run.group_size={group_size}: this method compares samples within a "
                      "group, so group_size must be > 1")
    if spec.selection == "kondo" and (grouped or group_size > 1):
        errors.append("method.selection='kondo' keeps or drops single samples, which would "
                      "break groups: use an ungrouped advantage with run.group_size 1")
    if not 0 < spec.keep_ratio <= 1:
        errors.append(f"method.keep_ratio={spec.keep_ratio} must lie in (0, 1]: it is the "
                      "fraction of samples kondo selection keeps on average")
    if spec.overlong.buffer < 0 or spec.overlong.factor < 0:
        errors.append("method.overlong_buffer and method.overlong_factor must be >= 0")
    if group_size > 0 and batch_size % group_size:
        errors.append(f"run.batch_size={batch_size} is not divisible by "
                      f"run.group_size={group_size}")
    o = spec.objective
    for name, value in (("clip_low", o.clip_low), ("clip_high", o.clip_high),
                        ("dual_clip", o.dual_clip)):
        if value < 0:
            errors.append(f"method.{name}={value} must be >= 0 (a negative clip bound inverts "
                          "the trust region)")
    if 0 < o.dual_clip <= 1:
        errors.append(f"method.dual_clip={o.dual_clip} must be > 1 (or 0 to turn it off)")
    if o.cap <= 0:
        errors.append(f"method.is_cap={o.cap} must be > 0")
    g = spec.gate
    if g.eta <= 0:
        errors.append(f"method.eta={g.eta} must be > 0")
    if g.s < 0 or g.tau <= 0 or not 0 <= g.guard_scale <= 1:
        errors.append("method.uncertainty_scale must be >= 0, method.filter_tau > 0 and "
                      "method.guard_scale in [0, 1]")
    if o.tpo_eta <= 0:
        errors.append(f"method.tpo_eta={o.tpo_eta} must be > 0")
    if o.candidate_kl < 0 or o.distill_alpha < 0:
        errors.append("method.candidate_kl and method.distill_alpha must be >= 0")
    if o.cispo_max <= 0 or o.r2vpo_lambda < 0 or o.dro_beta < 0:
        errors.append("method.cispo_max must be > 0, method.r2vpo_lambda and method.dro_beta "
                      ">= 0")
    if spec.kl.coef < 0:
        errors.append(f"method.kl_coef={spec.kl.coef} must be >= 0")
    if spec.kl.place == "reward" and not spec.needs_value and spec.kl.coef > 0:
        errors.append("method.kl_place='reward' needs a token-level advantage (gae); "
                      "use kl_place='loss' with this advantage")
    if spec.kl.target_value <= 0 or spec.kl.horizon <= 0:
        errors.append("method.kl_target_value and method.kl_horizon must be > 0")
    errors += _regularizer_errors(spec)
    if spec.entropy_coef < 0:
        errors.append(f"method.entropy_coef={spec.entropy_coef} must be >= 0")
    if spec.value.coef < 0 or spec.value.clip < 0:
        errors.append("method.vf_coef and method.value_clip must be >= 0")
    if not 0 <= spec.advantage.lam <= 1 or not 0 <= spec.advantage.gamma <= 1:
        errors.append("method.gamma and method.lam must lie in [0, 1]")
    if spec.advantage.std_floor < 0 or spec.advantage.clip < 0:
        errors.append("method.adv_std_floor and method.adv_clip must be >= 0")
    return errors


def _regularizer_errors(spec: MethodSpec) -> list[str]:
    """Why the KL warm-up, the ``full`` KL estimator or entropy control cannot run."""
    errors: list[str] = []
    k, e = spec.kl, spec.entropy
    if k.warmup_steps < 0:
        errors.append(f"method.kl_warmup_steps={k.warmup_steps} must be >= 0")
    if k.control == "warmup" and k.coef <= 0:
        errors.append("method.kl_control='warmup' needs kl_coef > 0 (β after the warm-up): "
                      "with kl_coef=0 β is 0 before and after, so the warm-up does nothing")
    if k.warmup_steps > 0 and k.control != "warmup":
        errors.append(f"method.kl_warmup_steps={k.warmup_steps} only acts with "
                      f"kl_control='warmup' (kl_control={k.control!r})")
    if k.estimator == "full" and k.coef > 0:
        if k.target != "ref":
            errors.append("method.kl_estimator='full' needs kl_target='ref': only the sampled "
                          "tokens' behaviour log-probs are stored, not the behaviour policy's "
                          "full distribution")
        if k.place != "loss":
            errors.append("method.kl_estimator='full' needs kl_place='loss': a per-token "
                          "reward penalty uses a sampled-token estimator (k1)")
    if e.window < 1:
        errors.append(f"method.entropy_window={e.window} must be >= 1")
    if e.target < 0:
        errors.append(f"method.entropy_target={e.target} must be >= 0 (an entropy is never "
                      "negative)")
    if e.control == "adaptive" and e.delta <= 0:
        errors.append(f"method.entropy_delta={e.delta} must be > 0 with "
                      "entropy_control='adaptive' (otherwise c never moves)")
    if e.control == "fixed" and e != EntropyConfig():
        errors.append("method.entropy_target, entropy_delta and entropy_window only act with "
                      "entropy_control='adaptive'")
    return errors


__all__ = [
    "METHODS",
    "MethodConfig",
    "MethodSpec",
    "canonical_method_name",
    "resolve_method",
    "validate_method",
]
