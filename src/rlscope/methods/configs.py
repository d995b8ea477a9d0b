"""The small frozen config of each component axis, each with its own ``validate``.

A `MethodSpec` (`rlscope.methods.spec`) holds one of each. ``validate()`` returns every reason
the config's own values are out of range (the messages name the command-line flag to change);
checks that relate several axes or the run live in `rlscope.methods.resolve.validate_method`.
"""

from __future__ import annotations

from dataclasses import dataclass


def choice_error(flag: str, value: str, valid: object) -> list[str]:
    """``[message]`` when ``value`` is not one of ``valid`` (a registry or a tuple), else []."""
    names = list(valid)  # type: ignore[call-overload]
    if value in names:
        return []
    return [f"method.{flag}={value!r} is unknown; valid: {', '.join(names)}"]


@dataclass(frozen=True)
class AdvantageConfig:
    """Advantage estimator (METHODS.md, "Advantage estimators")."""

    name: str = "expected"
    gamma: float = 1.0
    """Discount for token-level estimators (gae)."""
    lam: float = 0.95
    """GAE λ."""
    std_floor: float = 0.0
    """Clamp the group std from below before dividing (0 = off)."""
    clip: float = 0.0
    """Clamp |A| to this value after estimation (0 = off)."""
    gpg_std: bool = False
    """``gpg``: divide the centred reward by std_g + 1e-8 (F = std_g) instead of F = 1."""
    length_alpha: float = 0.0
    """``gae_decoupled``: α_L of the actor's λ_i = clamp(1 − 1/(α_L|y_i|), 0, 1) (0 = ``lam``)."""
    lam_critic: float = 1.0
    """``gae_decoupled``: λ of the critic's GAE targets (1 with γ = 1: Monte-Carlo returns)."""
    gpg_min_valid: float = 0.0
    """GPG's optional resampling: draw more rounds (at most ``--max_fill_rounds`` in all),
    swapping flat groups for mixed ones, until this fraction of the rows is in mixed groups
    (0 = off; the reference script uses 0.5, the paper's table 0.6)."""
    teacher_beta: float = 1.0
    """β_T of ``teacher_rkl``: A_t = −β_T (ℓ_μ,t − ℓ_T,t)."""
    teacher_gamma: float = 0.0
    """γ_T of ``teacher_rkl``: > 0 replaces A_t by its γ_T-discounted future sum."""
    teacher_env_coef: float = 0.0
    """c_env of ``teacher_rkl``: adds c_env × the ``env_advantage`` estimator on the task
    reward (0 = pure distillation)."""
    env_advantage: str = "group_zscore"
    """The task-reward estimator ``teacher_rkl`` mixes in when ``teacher_env_coef`` ≠ 0 (one
    that reads only rewards)."""

    def validate(self) -> list[str]:
        errors: list[str] = []
        if not 0 <= self.lam <= 1 or not 0 <= self.gamma <= 1:
            errors.append("method.gamma and method.lam must lie in [0, 1]")
        if self.std_floor < 0 or self.clip < 0:
            errors.append("method.adv_std_floor and method.adv_clip must be >= 0")
        if self.length_alpha < 0:
            errors.append(f"method.length_alpha={self.length_alpha} must be >= 0 (0 = the "
                          "fixed lam)")
        if not 0 <= self.lam_critic <= 1:
            errors.append(f"method.lam_critic={self.lam_critic} must lie in [0, 1]")
        if not 0 <= self.gpg_min_valid <= 1:
            errors.append(f"method.gpg_min_valid={self.gpg_min_valid} must lie in [0, 1] (a "
                          "fraction of the rows)")
        if self.teacher_beta <= 0 or not 0 <= self.teacher_gamma <= 1:
            errors.append(f"method.teacher_beta={self.teacher_beta} must be > 0 and "
                          f"method.teacher_gamma={self.teacher_gamma} in [0, 1]")
        if self.teacher_env_coef != 0 and self.env_advantage not in (
                "group_zscore", "group_center", "rloo", "batch_zscore", "constant", "maxrl",
                "passk"):
            errors.append(f"method.env_advantage={self.env_advantage!r}: teacher_rkl mixes in "
                          "an estimator that reads only rewards (group_zscore, group_center, "
                          "rloo, batch_zscore, constant, maxrl, passk)")
        return errors


@dataclass(frozen=True)
class GateConfig:
    """Influence gate multiplied into the advantage (METHODS.md, "Gates and weights")."""

    name: str = "none"
    eta: float = 1.0
    """Temperature η of the delight sigmoid."""
    s: float = 1.0
    """Uncertainty scale s of ``uncertainty_shift`` (subtracted s·u) and ``uncertainty_shrink``
    (A / (1 + s·u))."""
    tau: float = 0.5
    """Threshold τ of ``uncertainty_filter``: samples with reward std u > τ are dropped."""
    guard_scale: float = 0.5
    """Scale s of ``entropy_guard``: A > 0 weights × (1 − s·clamp(π(a) − 1/V, 0, 1))."""
    gate_age_decay: float = 0.02
    """λ_age of ``freshness``: weights × exp(−λ_age · batch age). `rlscope.config.validate`
    sets it from ``--replay_age_decay`` (METHODS.md's single λ_age)."""
    entropy_top_frac: float = 0.2
    """ρ_H of ``entropy_top``: the fraction of highest-entropy tokens of the optimizer batch
    that keep their advantage (1 keeps every token)."""
    opsm_delta: float = 0.5
    """δ of ``opsm``: rows with A < 0 whose mean sampler-minus-learner log-ratio exceeds δ are
    dropped."""

    def validate(self) -> list[str]:
        errors: list[str] = []
        if self.eta <= 0:
            errors.append(f"method.eta={self.eta} must be > 0")
        if self.s < 0 or self.tau <= 0 or not 0 <= self.guard_scale <= 1:
            errors.append("method.uncertainty_scale must be >= 0, method.filter_tau > 0 and "
                          "method.guard_scale in [0, 1]")
        if not 0 < self.entropy_top_frac <= 1:
            errors.append(f"method.entropy_top_frac={self.entropy_top_frac} must lie in (0, 1]")
        if self.opsm_delta <= 0:
            errors.append(f"method.opsm_delta={self.opsm_delta} must be > 0 (δ of the opsm "
                          "gate; a large δ turns the masking off)")
        return errors


@dataclass(frozen=True)
class ObjectiveConfig:
    """Per-token policy objective (METHODS.md, "Objectives")."""

    name: str = "score"
    clip_low: float = 0.2
    """PPO ε_low: ratios below 1 − ε_low are clipped when A < 0."""
    clip_high: float = 0.2
    """PPO ε_high: ratios above 1 + ε_high are clipped when A > 0."""
    dual_clip: float = 0.0
    """Dual-clip constant c > 1 caps the loss at −c·A for A < 0 (0 = off)."""
    cap: float = 10.0
    """Importance-weight cap of the is_capped objectives."""
    cispo_max: float = 5.0
    """CISPO ε_max: the stop-gradient importance weight is min(ρ, ε_max)."""
    r2vpo_lambda: float = 1.0
    """R²VPO λ: weight of the ratio-variance penalty λ(ρ − 1)²."""
    sapo_tau_pos: float = 1.0
    """SAPO temperature τ of the soft gate for A > 0."""
    sapo_tau_neg: float = 1.05
    """SAPO temperature τ of the soft gate for A < 0."""
    dro_beta: float = 0.05
    """DRO β: weight of the quadratic penalty (β/2)(ℓ − ℓ_μ)²."""
    pmd_tau: float = 1.0
    """PMD-mean τ scaling the summed log-ratio of a sequence."""
    tpo_eta: float = 1.0
    """TPO-family temperature η: the target is softmax(anchor + skill/η)."""
    candidate_kl: float = 0.04
    """``grpo_token``: β of the k3 penalty to the behaviour log-probs of each candidate."""
    distill_alpha: float = 0.5
    """``self_distill`` / ``scope_lite``: weight α of the supervised cross-entropy term."""
    dppo_delta_low: float = 0.15
    """DPPO δ_low: divergence bound for tokens with A <= 0 (TV: p_μ − p; KL: binary KL)."""
    dppo_delta_high: float = 0.15
    """DPPO δ_high: divergence bound for tokens with A > 0."""
    clip_cov_ratio: float = 2e-4
    """Clip-Cov r: k = max(1, ⌊r·N⌋) tokens of the batch lose their gradient."""
    clip_cov_low: float = 1.0
    """Clip-Cov ω_low: candidates have covariance C_t > ω_low."""
    clip_cov_high: float = 5.0
    """Clip-Cov ω_high: candidates have covariance C_t < ω_high."""
    kl_cov_ratio: float = 2e-3
    """KL-Cov k_r: the k = max(1, ⌊k_r·N⌋) largest-covariance tokens get the |d| penalty."""
    kl_cov_coef: float = 1.0
    """KL-Cov β: weight of β|ℓ − ℓ_μ| on the selected tokens."""
    gkd_beta: float = 0.5
    """``gkd_jsd``: β of JSD_β (0 = forward KL(P_T‖P_θ), 1 = reverse KL(P_θ‖P_T))."""
    gkd_temperature: float = 1.0
    """``gkd_jsd``: temperature τ of both distributions."""
    gkd_lambda: float = 1.0
    """``gkd_jsd``: fraction λ of student-sampled sequences (1 = on-policy only; λ < 1 needs
    labelled sequences and is not supported)."""
    opd_top_k: int = 2
    """``opd_topk_reverse_kl``: k of the top-k support, in [1, vocabulary size]."""
    opd_support: str = "student"
    """``opd_topk_reverse_kl``: the support S_t, ``student`` (top-k of π, chosen under
    no-grad), ``teacher`` (top-k of π_T) or ``intersection`` (both; may be empty)."""
    opd_warmup_steps: int = 0
    """``opd_topk_reverse_kl``: steps 0..W−1 use the exact full-vocabulary reverse KL, steps ≥ W
    the top-k loss (0 = no warm-up)."""

    def validate(self) -> list[str]:
        errors: list[str] = []
        for name, value in (("clip_low", self.clip_low), ("clip_high", self.clip_high),
                            ("dual_clip", self.dual_clip)):
            if value < 0:
                errors.append(f"method.{name}={value} must be >= 0 (a negative clip bound "
                              "inverts the trust region)")
        if 0 < self.dual_clip <= 1:
            errors.append(f"method.dual_clip={self.dual_clip} must be > 1 (or 0 to turn it off)")
        if self.cap <= 0:
            errors.append(f"method.is_cap={self.cap} must be > 0")
        if self.tpo_eta <= 0:
            errors.append(f"method.tpo_eta={self.tpo_eta} must be > 0")
        if self.candidate_kl < 0 or self.distill_alpha < 0:
            errors.append("method.candidate_kl and method.distill_alpha must be >= 0")
        if self.cispo_max <= 0 or self.r2vpo_lambda < 0 or self.dro_beta < 0:
            errors.append("method.cispo_max must be > 0, method.r2vpo_lambda and "
                          "method.dro_beta >= 0")
        if not 0 <= self.gkd_beta <= 1 or self.gkd_temperature <= 0:
            errors.append(f"method.gkd_beta={self.gkd_beta} must lie in [0, 1] and "
                          f"method.gkd_temperature={self.gkd_temperature} be > 0")
        if not 0 < self.gkd_lambda <= 1:
            errors.append(f"method.gkd_lambda={self.gkd_lambda} must lie in (0, 1]")
        elif self.gkd_lambda < 1:
            errors.append(f"method.gkd_lambda={self.gkd_lambda}: λ < 1 mixes in labelled "
                          "sequences, which needs a task with target sequences and is not "
                          "supported (METHODS_2026.md §5); use gkd_lambda 1")
        if self.opd_top_k < 1:
            errors.append(f"method.opd_top_k={self.opd_top_k} must be >= 1")
        if self.opd_support not in ("student", "teacher", "intersection"):
            errors.append(f"method.opd_support={self.opd_support!r} is unknown; valid: "
                          "student, teacher, intersection")
        if self.opd_warmup_steps < 0:
            errors.append(f"method.opd_warmup_steps={self.opd_warmup_steps} must be >= 0")
        if self.sapo_tau_pos <= 0 or self.sapo_tau_neg <= 0 or self.pmd_tau <= 0:
            errors.append("method.sapo_tau_pos, method.sapo_tau_neg and method.pmd_tau must "
                          "be > 0")
        return errors + self._validate_2026()

    def _validate_2026(self) -> list[str]:
        """METHODS_2026.md §4 ranges of the 2026 objectives' settings."""
        errors: list[str] = []
        if self.name == "gmpo" and (self.clip_low <= 0 or self.clip_high <= 0):
            errors.append(f"method.clip_low={self.clip_low} and method.clip_high="
                          f"{self.clip_high} are gmpo's log-space bounds ε_log: both must be > 0")
        if self.name == "dppo_tv" and not (0 < self.dppo_delta_low < 1
                                           and 0 < self.dppo_delta_high < 1):
            errors.append(f"method.dppo_delta_low={self.dppo_delta_low} and "
                          f"method.dppo_delta_high={self.dppo_delta_high} bound a total "
                          "variation: both must lie in (0, 1)")
        if self.name == "dppo_kl" and (self.dppo_delta_low <= 0 or self.dppo_delta_high <= 0):
            errors.append(f"method.dppo_delta_low={self.dppo_delta_low} and "
                          f"method.dppo_delta_high={self.dppo_delta_high} must be > 0")
        if not 0 < self.clip_cov_ratio < 1 or not 0 < self.kl_cov_ratio < 1:
            errors.append(f"method.clip_cov_ratio={self.clip_cov_ratio} and "
                          f"method.kl_cov_ratio={self.kl_cov_ratio} must lie in (0, 1)")
        if self.clip_cov_low >= self.clip_cov_high:
            errors.append(f"method.clip_cov_low={self.clip_cov_low} must be < "
                          f"method.clip_cov_high={self.clip_cov_high}")
        if self.kl_cov_coef < 0:
            errors.append(f"method.kl_cov_coef={self.kl_cov_coef} must be >= 0")
        if self.dual_clip > 0 and self.dual_clip <= 1 + self.clip_high:
            errors.append(f"method.dual_clip={self.dual_clip} must be > 1 + clip_high = "
                          f"{1 + self.clip_high} (or 0 to turn it off)")
        if self.name == "clip_cov" and self.dual_clip > 0:
            errors.append(f"method.dual_clip={self.dual_clip}: clip_cov's base is ppo_clip "
                          "without dual clip; set dual_clip 0")
        return errors


@dataclass(frozen=True)
class KLConfig:
    """KL regulariser (METHODS.md, "KL and entropy regularisers")."""

    coef: float = 0.0
    """β; 0 turns the term off."""
    estimator: str = "k3"
    """k1, k2, k3, abs (from the sampled tokens' log-probs), full (the exact categorical KL
    over the vocabulary; ``target="ref"`` and ``place="loss"`` only) or is_corrected (ρ·k3 to
    the reference, ρ = π/μ not detached; ``target="ref"`` and ``place="loss"`` only)."""
    target: str = "behaviour"
    """`ref` (frozen initial policy) or `behaviour` (the sampling policy)."""
    place: str = "loss"
    """`loss` adds β·agg(KL_t); `reward` subtracts β·KL_t from per-token rewards."""
    control: str = "fixed"
    """`fixed`, `adaptive` (Ziegler et al. proportional controller) or `warmup` (β = 0 for the
    first ``warmup_steps`` steps, then ``coef``)."""
    target_value: float = 6.0
    """Adaptive controller: the KL it steers towards (nats per sequence)."""
    horizon: float = 10000.0
    """Adaptive controller: samples over which β moves by at most 20%."""
    warmup_steps: int = 0
    """Warm-up control: loop steps (sampling rounds, counted from 0) with β = 0."""

    @property
    def exact(self) -> bool:
        """The estimator is the exact KL over the vocabulary (the learner must keep both
        policies' full log-probabilities), not one from the sampled tokens."""
        return self.estimator == "full"

    @property
    def importance_corrected(self) -> bool:
        """The estimator is ρ·k3 to the reference (``is_corrected``): the learner reads the
        behaviour log-probs too, and the ratio ρ is differentiated."""
        return self.estimator == "is_corrected"

    def validate(self) -> list[str]:
        """Range checks, and why the warm-up or the ``full`` estimator cannot run."""
        errors = (choice_error("kl_target", self.target, ("ref", "behaviour"))
                  + choice_error("kl_place", self.place, ("loss", "reward"))
                  + choice_error("kl_control", self.control, ("fixed", "adaptive", "warmup")))
        if self.coef < 0:
            errors.append(f"method.kl_coef={self.coef} must be >= 0")
        if self.target_value <= 0 or self.horizon <= 0:
            errors.append("method.kl_target_value and method.kl_horizon must be > 0")
        if self.warmup_steps < 0:
            errors.append(f"method.kl_warmup_steps={self.warmup_steps} must be >= 0")
        if self.control == "warmup" and self.coef <= 0:
            errors.append("method.kl_control='warmup' needs kl_coef > 0 (β after the warm-up): "
                          "with kl_coef=0 β is 0 before and after, so the warm-up does nothing")
        if self.warmup_steps > 0 and self.control != "warmup":
            errors.append(f"method.kl_warmup_steps={self.warmup_steps} only acts with "
                          f"kl_control='warmup' (kl_control={self.control!r})")
        if self.estimator == "is_corrected" and self.coef > 0 and (
                self.target != "ref" or self.place != "loss"):
            errors.append("method.kl_estimator='is_corrected' needs kl_target='ref' and "
                          "kl_place='loss' (it is ρ·k3 to the reference, ρ the behaviour ratio)")
        if self.estimator == "full" and self.coef > 0:
            if self.target != "ref":
                errors.append("method.kl_estimator='full' needs kl_target='ref': only the "
                              "sampled tokens' behaviour log-probs are stored, not the "
                              "behaviour policy's full distribution")
            if self.place != "loss":
                errors.append("method.kl_estimator='full' needs kl_place='loss': a per-token "
                              "reward penalty uses a sampled-token estimator (k1)")
        return errors


@dataclass(frozen=True)
class EntropyConfig:
    """Control of the entropy-bonus coefficient c (METHODS.md, "KL and entropy regularisers").

    The initial c is `MethodSpec.entropy_coef`. Adaptive mode (after Skywork-OR1's adaptive
    entropy control, He et al. 2505.22312): after every trained step, with H̄ the mean
    ``policy/entropy`` of the last ``window`` trained steps, c ← c + δ if H̄ < target, else
    c ← max(c − δ, 0). See `rlscope.methods.regularizers.adaptive_entropy_update`.
    """

    control: str = "fixed"
    """`fixed` (c = entropy_coef throughout) or `adaptive`."""
    target: float = 0.2
    """Adaptive: the entropy (nats per token, token mean of ``policy/entropy``) to hold."""
    delta: float = 1e-3
    """Adaptive: step δ of c per trained step."""
    window: int = 10
    """Adaptive: trained steps averaged into H̄ (fewer at the start of a run)."""

    def validate(self) -> list[str]:
        errors = choice_error("entropy_control", self.control, ("fixed", "adaptive"))
        if self.window < 1:
            errors.append(f"method.entropy_window={self.window} must be >= 1")
        if self.target < 0:
            errors.append(f"method.entropy_target={self.target} must be >= 0 (an entropy is "
                          "never negative)")
        if self.control == "adaptive" and self.delta <= 0:
            errors.append(f"method.entropy_delta={self.delta} must be > 0 with "
                          "entropy_control='adaptive' (otherwise c never moves)")
        if self.control == "fixed" and self != EntropyConfig():
            errors.append("method.entropy_target, entropy_delta and entropy_window only act "
                          "with entropy_control='adaptive'")
        return errors


@dataclass(frozen=True)
class ValueConfig:
    """Critic settings for value-based advantage estimators (gae)."""

    coef: float = 0.1
    """vf_coef: weight of the value loss in the total loss."""
    clip: float = 0.2
    """Clip range of the value prediction around the old value (0 = off)."""
    pretrain_steps: int = 0
    """Value-head-only steps before training, on samples of the frozen initial policy with
    λ = 1 (Monte-Carlo) targets (VAPO's value pre-training; 0 = none)."""

    def validate(self) -> list[str]:
        errors: list[str] = []
        if self.coef < 0 or self.clip < 0:
            errors.append("method.vf_coef and method.value_clip must be >= 0")
        if self.pretrain_steps < 0:
            errors.append(f"method.critic_pretrain_steps={self.pretrain_steps} must be >= 0")
        return errors


@dataclass(frozen=True)
class OverlongConfig:
    """Handling of completions that hit the length limit (METHODS.md, "Selection"; DAPO,
    Yu et al. arXiv:2503.14476). Acts only where completions can end early (stop tokens):
    `rlscope.config.derive` records the mode in force, ``Derived.overlong``, which is
    ``none`` on fixed-length tasks."""

    name: str = "none"
    """``none``, ``mask`` (zero the loss mask of rows truncated without a stop token) or
    ``penalty`` (add min(−(|y| − (L_max − L_buf))/L_buf · factor, 0) to the reward)."""
    buffer: int = 0
    """L_buf, the soft-penalty window before L_max in tokens; 0 = max(1, L_max // 4)."""
    factor: float = 1.0
    """Penalty at |y| = L_max (the slope is factor / L_buf)."""

    def validate(self) -> list[str]:
        if self.buffer < 0 or self.factor < 0:
            return ["method.overlong_buffer and method.overlong_factor must be >= 0"]
        return []
