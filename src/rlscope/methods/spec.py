"""`MethodSpec`: a method preset as data — one component per axis, plus what it needs.

A preset picks an advantage estimator, a gate, an objective, a token aggregation, KL and entropy
regularisers, an optional critic and a selection rule. The loop reads the derived ``needs_*``
properties and never compares method names.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlscope.methods.corrections import CorrectionConfig

GROUP_OBJECTIVES = frozenset({"tpo", "tpo_no_anchor", "group_pg"})
"""Objectives over the samples of a group: micro-batches must hold whole groups."""
CANDIDATE_OBJECTIVES = frozenset({"tpo_token", "grpo_token"})
"""Objectives over next-token candidates: the loop samples a `CandidateBatch`."""
LABEL_OBJECTIVES = frozenset({"self_distill", "scope_lite"})
"""Objectives with a cross-entropy on the task's labels at the actor's prefixes."""


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


@dataclass(frozen=True)
class KLConfig:
    """KL regulariser (METHODS.md, "KL and entropy regularisers")."""

    coef: float = 0.0
    """β; 0 turns the term off."""
    estimator: str = "k3"
    """k1, k2, k3, abs (from the sampled tokens' log-probs) or full (the exact categorical KL
    over the vocabulary; ``target="ref"`` and ``place="loss"`` only)."""
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


@dataclass(frozen=True)
class ValueConfig:
    """Critic settings for value-based advantage estimators (gae)."""

    coef: float = 0.1
    """vf_coef: weight of the value loss in the total loss."""
    clip: float = 0.2
    """Clip range of the value prediction around the old value (0 = off)."""


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


@dataclass(frozen=True)
class MethodSpec:
    """One method preset. Fields are components; properties say what the loop must provide."""

    description: str
    source: str
    regime: str
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    gate: GateConfig = field(default_factory=GateConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    agg: str = "token_mean"
    kl: KLConfig = field(default_factory=KLConfig)
    entropy_coef: float = 0.0
    """Entropy bonus c: the loss gains −c·agg(H_t) (the initial c under adaptive control)."""
    entropy: EntropyConfig = field(default_factory=EntropyConfig)
    """How c moves during the run (fixed unless adaptive)."""
    value: ValueConfig = field(default_factory=ValueConfig)
    selection: str = "none"
    """``none``, ``mixed_groups`` (keep groups whose rewards differ) or ``kondo`` (keep samples
    by their delight before any learner forward)."""
    keep_ratio: float = 0.5
    """``kondo`` selection: the mean keep probability the threshold λ is solved for."""
    overlong: OverlongConfig = field(default_factory=OverlongConfig)
    """Masking or reward shaping of completions truncated at the length limit."""
    correction: CorrectionConfig = field(default_factory=CorrectionConfig)
    """Sampler-vs-learner importance correction multiplied into the per-token loss."""
    grouped: bool = False
    """Needs grouped sampling (group_size > 1, batch divisible by the group size)."""
    requires: tuple[str, ...] = ()
    """What the run must provide (checked by `rlscope.config.validate`): ``replay`` (a replay
    buffer), ``staleness`` (delay or replay), ``token_rewards`` (a task with clean, non-binary
    rewards that decompose over tokens), ``binary_rewards``, ``clean_rewards`` (no reward
    noise), ``bandit`` (a one-action task), ``on_policy`` (no delay, no replay),
    ``single_epoch`` (one inner epoch of one minibatch), ``token_labels`` (a sequence task with
    per-token labels), ``no_kl`` (the method is defined without a KL term)."""

    @property
    def needs_value(self) -> bool:
        return self.advantage.name == "gae"

    @property
    def needs_reference(self) -> bool:
        return self.kl.coef > 0 and self.kl.target == "ref"

    @property
    def needs_candidates(self) -> bool:
        """The loop samples K = group_size next-token candidates per generated position."""
        return self.objective.name in CANDIDATE_OBJECTIVES

    @property
    def needs_token_labels(self) -> bool:
        """The objective reads the task's labels next to the actor's own tokens."""
        return self.objective.name in LABEL_OBJECTIVES

    @property
    def needs_whole_groups(self) -> bool:
        """The objective couples the rows of a group (micro-batches hold whole groups)."""
        return self.objective.name in GROUP_OBJECTIVES

    @property
    def needs_greedy_baseline(self) -> bool:
        """The loop decodes each prompt greedily once and attaches its reward (ReMax)."""
        return self.advantage.name == "remax"

    @property
    def needs_behaviour_sum_p2(self) -> bool:
        """The sampler records Σ_v μ(v | prefix)² (kondo's baseline when E[r | x] is not
        exposed)."""
        return self.selection == "kondo"

    @property
    def uses_entropy_bonus(self) -> bool:
        """The loss has an entropy term (its coefficient may start at 0 and move)."""
        return self.entropy_coef > 0 or self.entropy.control == "adaptive"

    @property
    def needs_labels(self) -> bool:
        """The learner is teacher-forced on the task's ground truth instead of the rollout."""
        return self.objective.name == "ce_oracle"
