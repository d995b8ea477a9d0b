"""Command-line overrides of a preset (`MethodConfig`, `FLAGS`) and method validation.

``resolve_method(name, MethodConfig)`` looks a preset up (`rlscope.methods.presets`) and applies
every set override (``--method grpo --advantage group_center`` is the Dr. GRPO ablation);
``validate_method`` rejects configurations outside a method's valid regime. Each component
setting is declared once, as a field of its axis's config (`rlscope.methods.configs`), and
mapped to its flag once, by `FLAGS`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rlscope.methods.advantages import ADVANTAGES
from rlscope.methods.aggregation import AGGREGATIONS
from rlscope.methods.configs import choice_error
from rlscope.methods.corrections import CORRECTIONS
from rlscope.methods.gates import GATES
from rlscope.methods.objectives import OBJECTIVES
from rlscope.methods.presets import METHODS, canonical_method_name
from rlscope.methods.regularizers import KL_ESTIMATORS
from rlscope.methods.selection import OVERLONG, SELECTIONS
from rlscope.methods.spec import MethodSpec


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
    sapo_tau_pos: float | None = None
    """SAPO temperature τ of the soft gate where A > 0 (> 0)."""
    sapo_tau_neg: float | None = None
    """SAPO temperature τ of the soft gate where A <= 0 (> 0)."""
    pmd_tau: float | None = None
    """pmd_mean: τ scaling the summed log-ratio regressed onto the reward's surplus (> 0)."""
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
    is_correction_cap_low: float | None = None
    """C_min of the truncate corrections: weight clamp(π_learner/π_sampler, C_min, C), in
    [0, is_correction_cap) (0 = no lower bound)."""
    is_keep_ratio: bool | None = None
    """Mask corrections weight the kept tokens by their ratio, ρ·1[C_min <= ρ <= C_max]
    (IcePop, TRL), instead of by 1."""
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
    entropy_top_frac: float | None = None
    """entropy_top gate (dapo_forking): fraction ρ_H of highest-entropy tokens of the
    optimizer batch that keep their advantage, in (0, 1] (1 = no gate)."""
    dppo_delta_low: float | None = None
    """dppo_tv / dppo_kl: divergence bound δ_low for tokens with A <= 0 (TV in (0, 1);
    KL > 0)."""
    dppo_delta_high: float | None = None
    """dppo_tv / dppo_kl: divergence bound δ_high for tokens with A > 0."""
    clip_cov_ratio: float | None = None
    """clip_cov: fraction r of the batch's tokens whose gradient is cut, in (0, 1)."""
    clip_cov_low: float | None = None
    """clip_cov: lower covariance bound ω_low of the candidates (< clip_cov_high)."""
    clip_cov_high: float | None = None
    """clip_cov: upper covariance bound ω_high of the candidates."""
    kl_cov_ratio: float | None = None
    """kl_cov: fraction k_r of the batch's tokens (largest covariance) penalised, in (0, 1)."""
    kl_cov_coef: float | None = None
    """kl_cov: weight β of the |ℓ − ℓ_μ| penalty on the selected tokens (>= 0)."""
    gpg_std: bool | None = None
    """gpg advantage: divide by the group std (F = std_g + 1e-8) instead of F = 1."""
    length_alpha: float | None = None
    """gae_decoupled: α_L of the length-adaptive actor λ_i = clamp(1 − 1/(α_L|y_i|), 0, 1)
    (>= 0; 0 = the fixed --lam)."""
    lam_critic: float | None = None
    """gae_decoupled: λ of the critic's GAE targets, in [0, 1] (1 = Monte-Carlo returns)."""
    critic_pretrain_steps: int | None = None
    """Value-head-only steps on samples of the frozen initial policy before training (vapo
    needs >= 1)."""
    pos_nll_coef: float | None = None
    """μ of the LM loss on successful rows (vapo's positive-example NLL; >= 0, 0 = off)."""
    fp32_head: bool | None = None
    """LM head matmul and log-softmax in float32 under mixed precision (scalerl)."""
    gpg_min_valid: float | None = None
    """GPG resampling: draw more rounds (up to --max_fill_rounds), swapping flat groups for
    mixed ones, until this fraction of rows is in mixed groups (0 = off; GPG's script 0.5)."""
    opsm_delta: float | None = None
    """opsm gate (dsv32): δ > 0; rows with A < 0 whose mean log(π_sampler/π) exceeds δ are
    dropped."""
    teacher_beta: float | None = None
    """teacher_rkl advantage (opd): β_T > 0 scaling −(ℓ_μ − ℓ_teacher)."""
    teacher_gamma: float | None = None
    """teacher_rkl advantage (opd): γ_T in [0, 1]; > 0 sums the per-token advantage over the
    future with discount γ_T."""
    teacher_env_coef: float | None = None
    """teacher_rkl advantage (opd): c_env, the weight of the task-reward advantage mixed in
    (0 = pure distillation)."""
    env_advantage: str | None = None
    """teacher_rkl advantage (opd): the task-reward estimator mixed in with teacher_env_coef
    (group_zscore, group_center, rloo, batch_zscore, constant, maxrl, passk)."""
    gkd_beta: float | None = None
    """gkd_jsd objective (gkd): β in [0, 1] of JSD_β (0 = forward KL, 1 = reverse KL)."""
    gkd_temperature: float | None = None
    """gkd_jsd objective (gkd): temperature τ > 0 of the student's and teacher's
    distributions."""
    gkd_lambda: float | None = None
    """gkd_jsd objective (gkd): fraction λ of student samples; only 1 is supported."""
    opd_top_k: int | None = None
    """opd_topk_reverse_kl: k of the top-k support, in [1, vocabulary size]."""
    opd_support: str | None = None
    """opd_topk_reverse_kl: the support, student (top-k of π), teacher (top-k of π_T) or
    intersection (both)."""
    opd_warmup_steps: int | None = None
    """opd_topk_reverse_kl: steps 0..W−1 train the exact full-vocabulary reverse KL, then the
    top-k loss; W in [0, num_steps); W > 0 adds an evaluation at step W (phase "switch")."""



FLAGS: dict[str, str] = {
    "advantage": "advantage.name",
    "gate": "gate.name",
    "objective": "objective.name",
    "agg": "agg",
    "selection": "selection",
    "keep_ratio": "keep_ratio",
    "overlong": "overlong.name",
    "overlong_buffer": "overlong.buffer",
    "overlong_factor": "overlong.factor",
    "eta": "gate.eta",
    "uncertainty_scale": "gate.s",
    "filter_tau": "gate.tau",
    "guard_scale": "gate.guard_scale",
    "cispo_max": "objective.cispo_max",
    "r2vpo_lambda": "objective.r2vpo_lambda",
    "dro_beta": "objective.dro_beta",
    "sapo_tau_pos": "objective.sapo_tau_pos",
    "sapo_tau_neg": "objective.sapo_tau_neg",
    "pmd_tau": "objective.pmd_tau",
    "tpo_eta": "objective.tpo_eta",
    "candidate_kl": "objective.candidate_kl",
    "distill_alpha": "objective.distill_alpha",
    "is_correction": "correction.name",
    "is_correction_cap": "correction.cap",
    "is_band_low": "correction.band_low",
    "is_band_high": "correction.band_high",
    "is_geometric": "correction.geometric",
    "is_correction_cap_low": "correction.cap_low",
    "is_keep_ratio": "correction.keep_ratio",
    "clip_low": "objective.clip_low",
    "clip_high": "objective.clip_high",
    "dual_clip": "objective.dual_clip",
    "is_cap": "objective.cap",
    "kl_coef": "kl.coef",
    "kl_estimator": "kl.estimator",
    "kl_target": "kl.target",
    "kl_place": "kl.place",
    "kl_control": "kl.control",
    "kl_target_value": "kl.target_value",
    "kl_horizon": "kl.horizon",
    "kl_warmup_steps": "kl.warmup_steps",
    "entropy_coef": "entropy_coef",
    "entropy_control": "entropy.control",
    "entropy_target": "entropy.target",
    "entropy_delta": "entropy.delta",
    "entropy_window": "entropy.window",
    "vf_coef": "value.coef",
    "value_clip": "value.clip",
    "gamma": "advantage.gamma",
    "lam": "advantage.lam",
    "adv_std_floor": "advantage.std_floor",
    "adv_clip": "advantage.clip",
    "entropy_top_frac": "gate.entropy_top_frac",
    "dppo_delta_low": "objective.dppo_delta_low",
    "dppo_delta_high": "objective.dppo_delta_high",
    "clip_cov_ratio": "objective.clip_cov_ratio",
    "clip_cov_low": "objective.clip_cov_low",
    "clip_cov_high": "objective.clip_cov_high",
    "kl_cov_ratio": "objective.kl_cov_ratio",
    "kl_cov_coef": "objective.kl_cov_coef",
    "gpg_std": "advantage.gpg_std",
    "length_alpha": "advantage.length_alpha",
    "lam_critic": "advantage.lam_critic",
    "critic_pretrain_steps": "value.pretrain_steps",
    "pos_nll_coef": "pos_nll_coef",
    "fp32_head": "fp32_head",
    "gpg_min_valid": "advantage.gpg_min_valid",
    "opsm_delta": "gate.opsm_delta",
    "teacher_beta": "advantage.teacher_beta",
    "teacher_gamma": "advantage.teacher_gamma",
    "teacher_env_coef": "advantage.teacher_env_coef",
    "env_advantage": "advantage.env_advantage",
    "gkd_beta": "objective.gkd_beta",
    "gkd_temperature": "objective.gkd_temperature",
    "gkd_lambda": "objective.gkd_lambda",
    "opd_top_k": "objective.opd_top_k",
    "opd_support": "objective.opd_support",
    "opd_warmup_steps": "objective.opd_warmup_steps",
}
"""The one table from a `MethodConfig` field (the flag ``--<key>``) to the `MethodSpec` setting
it overrides: ``axis.field`` for a component config's field, ``field`` for the spec's own."""

SET_ELSEWHERE: dict[str, str] = {"gate.gate_age_decay": "replay_age_decay"}
"""Settings set from a flag of another section of `rlscope.config.TrainConfig` (by
`rlscope.config.validate`): METHODS.md has one λ_age, the replay buffer's and the freshness
gate's."""

INTERNAL: frozenset[str] = frozenset()
"""Settings deliberately reachable from no flag (none today; `tests/test_components.py` fails
on a setting that is in none of `FLAGS`, `SET_ELSEWHERE` and this set)."""

_FLAG_OF = {path: flag for flag, path in FLAGS.items()} | SET_ELSEWHERE


def flag_of(path: str) -> str:
    """The flag that sets the setting ``path`` (``axis.field`` or ``field``); "" when none."""
    return _FLAG_OF.get(path, "")


def resolve_method(name: str, cfg: MethodConfig | None = None) -> MethodSpec:
    """The preset ``name`` with every set override of ``cfg`` applied (via `FLAGS`)."""
    spec = METHODS[canonical_method_name(name)]
    if cfg is None:
        return spec
    changes: dict[str, dict[str, object]] = {}
    for flag, path in FLAGS.items():
        value = getattr(cfg, flag)
        if value is not None:
            axis, _, field = path.rpartition(".")
            changes.setdefault(axis, {})[field] = value
    if not changes:
        return spec
    own = changes.pop("", {})
    axes = {axis: dataclasses.replace(getattr(spec, axis), **fields)
            for axis, fields in changes.items()}
    return dataclasses.replace(spec, **own, **axes)  # type: ignore[arg-type]


def validate_method(spec: MethodSpec, group_size: int, batch_size: int) -> list[str]:
    """Every reason this method cannot run as configured (empty when it can): unknown names,
    what the components need of the run, then each axis's own ``validate``."""
    errors = (choice_error("advantage", spec.advantage.name, ADVANTAGES)
              + choice_error("gate", spec.gate.name, GATES)
              + choice_error("objective", spec.objective.name, OBJECTIVES)
              + choice_error("agg", spec.agg, AGGREGATIONS)
              + choice_error("selection", spec.selection, SELECTIONS)
              + choice_error("overlong", spec.overlong.name, OVERLONG)
              + choice_error("kl_estimator", spec.kl.estimator, KL_ESTIMATORS)
              + choice_error("is_correction", spec.correction.name, CORRECTIONS))
    grouped = spec.needs_groups
    own_agg = spec.objective_component.own_aggregation
    if own_agg is not None and spec.agg != own_agg:
        errors.append(f"method.agg={spec.agg!r}: objective {spec.objective.name!r} is defined "
                      f"with agg={own_agg!r} (its loss is a mean over "
                      f"{'groups' if spec.needs_whole_groups else 'prefixes'})")
    if grouped and group_size < 2:
        errors.append(f"run.group_size={group_size}: this method compares samples within a "
                      "group, so group_size must be > 1")
    if spec.selection_component.ungrouped and (grouped or group_size > 1):
        errors.append(f"method.selection={spec.selection!r} keeps or drops single samples, "
                      "which would break groups: use an ungrouped advantage with "
                      "run.group_size 1")
    if not 0 < spec.keep_ratio <= 1:
        errors.append(f"method.keep_ratio={spec.keep_ratio} must lie in (0, 1]: it is the "
                      "fraction of samples kondo selection keeps on average")
    if group_size > 0 and batch_size % group_size:
        errors.append(f"run.batch_size={batch_size} is not divisible by "
                      f"run.group_size={group_size}")
    if spec.kl.place == "reward" and not spec.needs_value and spec.kl.coef > 0:
        errors.append("method.kl_place='reward' needs a token-level advantage (gae); "
                      "use kl_place='loss' with this advantage")
    if spec.entropy_coef < 0:
        errors.append(f"method.entropy_coef={spec.entropy_coef} must be >= 0")
    if spec.gate_component.batch_statistic is not None \
            and spec.objective_component.batch_statistic is not None:
        errors.append(f"method.gate={spec.gate.name!r} and method.objective="
                      f"{spec.objective.name!r} both select tokens over the batch; keep one")
    if spec.pos_nll_coef < 0:
        errors.append(f"method.pos_nll_coef={spec.pos_nll_coef} must be >= 0")
    if spec.value.pretrain_steps > 0 and not spec.needs_value:
        errors.append(f"method.critic_pretrain_steps={spec.value.pretrain_steps} pre-trains a "
                      "value head, which this advantage does not use: use gae or gae_decoupled, "
                      "or drop --critic_pretrain_steps")
    if spec.agg == "prompt_mean" and not grouped:
        errors.append("method.agg='prompt_mean' averages over groups: use a grouped method "
                      "with run.group_size > 1")
    for axis in (spec.advantage, spec.gate, spec.objective, spec.kl, spec.entropy, spec.value,
                 spec.overlong, spec.correction):
        errors += axis.validate()
    return errors
