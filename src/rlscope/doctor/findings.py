"""A doctor finding, and the config of the doctor's thresholds.

A `Finding` is what a rule reports: an id, a severity, a one-line title, the evidence (the
metrics, steps and values it rests on, with trend statistics), the mechanism in two or three
sentences, the recommended actions and a confidence in [0, 1]. `Unavailable` is what a rule
returns when the log lacks the metrics it needs: the doctor lists those once, instead of
guessing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

SEVERITIES = ("info", "warning", "critical")


@dataclass(frozen=True)
class Finding:
    id: str
    severity: str
    title: str
    evidence: dict[str, Any]
    mechanism: str
    actions: tuple[str, ...]
    confidence: float
    step: float | None = None
    """The step at which the pattern starts (a crossing, the first spike), where one exists."""
    causes: tuple[str, ...] = ()
    """Ids of other findings that likely caused this one (linked after all rules ran)."""

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["actions"] = list(self.actions)
        out["causes"] = list(self.causes)
        return out


@dataclass(frozen=True)
class Unavailable:
    """The rule could not run, and the true reason (issue 16, "Short logs"):

    - ``missing``: the log lacks ``needs`` (any one of them; ``all_of``: every one of them).
      Only metrics that are absent are listed, never one that is present.
    - ``too_few_steps``: the metric is there but has fewer logged steps than the check needs;
      ``detail`` says how many it has and needs.
    - ``config``: a configuration value is missing or makes the check inapplicable; ``detail``
      says which.
    """

    needs: tuple[str, ...]
    all_of: bool = False
    reason: str = "missing"
    detail: str = ""

    def __str__(self) -> str:
        if self.reason == "too_few_steps":
            return f"too few steps ({self.detail})"
        if self.reason == "config":
            return f"not applicable: {self.detail}" if self.detail else \
                "needs " + " or ".join(self.needs)
        return "needs " + (" and " if self.all_of else " or ").join(self.needs)


@dataclass(frozen=True)
class DoctorConfig:
    """Thresholds of the doctor's rules (each rule's docstring says how it uses them)."""

    entropy_floor: float = 0.1
    """entropy_collapse: entropy (nats/token) below this is collapsed ..."""
    entropy_floor_frac: float = 0.1
    """... or below this fraction of its starting value (whichever threshold is higher)."""
    amplification: float = 3.0
    """sigma_amplification: adv/amplification above this means normalisation inflates gaps."""
    kl_negative_tol: float = 1e-4
    """negative_kl: a mean KL below −max(this, 3 standard errors) is negative beyond noise."""
    kl_runaway_factor: float = 3.0
    """kl_runaway: KL above this multiple of the adaptive controller's target ..."""
    kl_runaway_growth: float = 10.0
    """... or, with no target, the last window's KL this many times the first window's ..."""
    kl_ceiling: float = 0.5
    """... and above this many nats per token ..."""
    kl_acceleration: float = 3.0
    """... or its last third's slope this many times its first two thirds' slope."""
    kl_small: float = 1e-4
    """kl_too_small: a per-token KL to the behaviour policy below this is tiny."""
    value_spike_z: float = 6.0
    """value_instability: a value-loss robust z-score above this is a spike ..."""
    value_spike_ratio: float = 2.0
    """... if the loss is also at least this many times the median of its neighbours."""
    no_signal_frac: float = 0.5
    """no_signal: zero-advantage (or zero-std group) fraction above this."""
    length_corr: float = 0.7
    """length_hacking: |correlation| of length with reward above this, with length trending."""
    clip_ratio: float = 0.1
    """truncation: truncated fraction (length/clip_ratio) above this in the last window."""
    mismatch_tol: float = 1e-3
    """sampler_mismatch: |first-pass ratio − 1| above this on an on-policy run."""
    mismatch_k2: float = 1e-3
    """sampler_mismatch: first-pass ½(ℓ_learner − ℓ_sampler)² above this (a gap of ~0.045 nats;
    engines that share numerics stay orders of magnitude below)."""
    outside_band: float = 0.01
    """sampler_mismatch: fraction of tokens with ρ outside [0.9, 1.1] above this."""
    clip_saturation: float = 0.8
    """grad_clip_saturation: fraction of steps with the clip active above this."""
    oscillation_balance: float = 0.2
    """oscillation: |ups − downs| / (ups + downs) below this, with a flat trend."""
    min_steps: int = 10
    """Rules about trends need at least this many logged steps."""
    stale_age: float = 5.0
    """stale_replay: mean replay age this many steps above the configured delay."""
    kl_dip_frac: float = 0.1
    """negative_kl: fires also when this fraction of steps dips far below zero (below
    −max(kl_negative_tol, 4 robust standard deviations of the series))."""
    kl_numeric_zero: float = 1e-8
    """kl_too_small: a median |KL| below this is zero to float precision (measured before any
    update), so the check does not apply."""
    kl_small_frac: float = 0.9
    """kl_too_small: fraction of steps whose |KL| is below kl_small."""
    mismatch_growth: float = 10.0
    """sampler_mismatch: a mismatch metric growing this many times over from an onset."""
    peak_gain_lost: float = 0.25
    """reward_peak_fall: fraction of the rise to the peak given back by the last window."""
    plateau_frac: float = 0.3
    """reward_plateau: the flat stretch must cover at least this fraction of the steps."""
    throughput_drop: float = 0.2
    """throughput_regression: throughput down by this fraction (or step time up by it)."""
    rank_imbalance: float = 0.2
    """rank_imbalance: the slowest rank's step time above the mean over ranks by this
    fraction in the median step."""
    clip_ratio_rising: float = 0.02
    """truncation: a truncated fraction rising beyond noise is reported from this level."""
    env_tokens_in_loss: float = 0.0
    """env_tokens_in_loss: a fraction of environment tokens inside the loss mask above this at
    any step (a correct multi-turn run trains on none)."""
    turn_budget_frac: float = 0.3
    """turn_budget_exhaustion: episodes truncated by a budget (max_turns, max_turn_tokens or
    max_episode_tokens) above this fraction in the last window."""
    env_time_share: float = 0.5
    """env_time_dominates: the environments' seconds above this share of the step in the
    median step."""
