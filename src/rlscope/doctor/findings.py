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
    """The rule could not run: ``needs`` names what it lacks, any one of them (``all_of``:
    every one of them)."""

    needs: tuple[str, ...]
    all_of: bool = False

    def __str__(self) -> str:
        return (" and " if self.all_of else " or ").join(self.needs)


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
    """value_instability: a value-loss robust z-score above this is a spike."""
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
