"""Entropy rules: the policy's entropy collapsing (and recovering) or rising.
"""

from __future__ import annotations

import numpy as np

from rlscope.doctor.findings import DoctorConfig, Finding, Unavailable
from rlscope.doctor.rules.common import (
    RuleOut,
    _need,
    _r,
)
from rlscope.doctor.stats import (
    MIN_WINDOW,
    onset,
    trend,
    window_size,
)
from rlscope.doctor.table import MetricTable

ENTROPY = ("policy/entropy", "policy/entropy_sampled")


def entropy_collapse(t: MetricTable, c: DoctorConfig) -> RuleOut:
    """Entropy below max(entropy_floor, entropy_floor_frac × its start) from some step on
    (≥ 80% of later points, and the last window), with the crossing step, the decay rate
    (slope of log entropy per step up to the crossing) and the fraction of steps below. The
    start is the mean of the first three points: a collapse can take only a few steps."""
    name = _need(t, ENTROPY, c.min_steps)
    if isinstance(name, Unavailable):
        return name
    steps, h = t.series(name)
    w = window_size(len(h))
    start = float(h[:MIN_WINDOW].mean())  # the first few steps: a collapse can be fast
    threshold = max(c.entropy_floor, c.entropy_floor_frac * start)
    below = h < threshold
    if not below[-w:].all():
        return _collapse_then_recovery(name, steps, h, start, threshold, c)
    # The crossing is the first point below the threshold from which entropy stays below
    # (≥ 80% of the points from it on); an earlier isolated dip must not hide a later
    # collapse. The last window is all below, so such a point exists.
    frac_below_from = np.cumsum(below[::-1])[::-1] / np.arange(len(h), 0, -1)
    crossing = int(np.argmax(below & (frac_below_from >= 0.8)))
    pre = h[: crossing + 1]
    # No decay rate without points before the crossing (None, not nan: findings.json is JSON).
    rate = _r(float(np.polyfit(steps[: crossing + 1], np.log(np.maximum(pre, 1e-12)), 1)[0])) \
        if crossing >= 2 else None
    decline = onset(steps, h)
    return [Finding(
        "entropy_collapse", "warning",
        f"{name} collapsed below {threshold:.3g} at step {steps[crossing]:g} "
        f"({float(below.mean()):.0%} of steps below)",
        {"metric": name, "start": _r(start), "threshold": _r(threshold),
         "crossing_step": float(steps[crossing]), "last": _r(float(h[-w:].mean())),
         "decay_rate_per_step": rate, "frac_steps_below": _r(float(below.mean())),
         "decline_onset_step": decline.step if decline is not None else None},
        "The policy became nearly deterministic: it samples almost the same tokens every time, "
        "so groups carry no variance and exploration is lost. Normalised advantages on easy "
        "groups and large learning rates speed this up.",
        ("check sigma_amplification (group std normalisation on easy groups)",
         "lower the learning rate ({lr})", "?add an entropy bonus ({entropy_coef})",
         "?centre advantages without dividing by the group std ({adv_center})",
         "?raise the upper clip bound, clip-higher ({clip_high})"),
        0.9, step=float(steps[crossing]))]


def _collapse_then_recovery(name: str, steps: np.ndarray, h: np.ndarray, start: float,
                            threshold: float, c: DoctorConfig) -> RuleOut:
    """Entropy below the threshold for a long stretch (at least max(min_steps/2, 20% of the
    steps) consecutive points) that it later left: a collapse the run recovered from (or is
    oscillating through), reported with where it started and how long it lasted."""
    below = h < threshold
    best_len, best_start, run_len = 0, 0, 0
    for i, b in enumerate(below):
        run_len = run_len + 1 if b else 0
        if run_len > best_len:
            best_len, best_start = run_len, i - run_len + 1
    if best_len < max(c.min_steps // 2, int(0.2 * len(h))):
        return []
    first, last = float(steps[best_start]), float(steps[best_start + best_len - 1])
    return [Finding(
        "entropy_collapse", "warning",
        f"{name} collapsed below {threshold:.3g} at step {first:g} and stayed there for "
        f"{best_len} steps (to step {last:g}) before rising again",
        {"metric": name, "start": _r(start), "threshold": _r(threshold),
         "crossing_step": first, "until_step": last, "steps_below": best_len,
         "min": _r(float(h.min())), "frac_steps_below": _r(float(below.mean())),
         "recovered": True},
        "The policy became nearly deterministic for a stretch of the run; it recovered, but "
        "while collapsed its groups carried little variance. A learning rate large enough to "
        "collapse it in a few steps makes the run swing between collapse and recovery.",
        ("lower the learning rate ({lr})", "?add an entropy bonus ({entropy_coef})",
         "?raise the upper clip bound, clip-higher ({clip_high})"),
        0.7, step=first)]


def entropy_rising(t: MetricTable, c: DoctorConfig) -> RuleOut:
    """Entropy trending up beyond noise (slope interval above 0) while length rises or reward
    falls beyond noise."""
    name = _need(t, ENTROPY, c.min_steps)
    if isinstance(name, Unavailable):
        return name
    tr = trend(*t.series(name))
    if tr.direction != "up" or tr.slope_low <= 0:
        return []
    companions = {}
    if t.has("length/mean", c.min_steps) and trend(*t.series("length/mean")).direction == "up":
        companions["length/mean"] = "up"
    if t.has("reward/mean", c.min_steps) and \
            trend(*t.series("reward/mean")).direction == "down":
        companions["reward/mean"] = "down"
    if not companions:
        return []
    o = onset(*t.series(name))
    start = o.step if o is not None else tr.first_step
    return [Finding(
        "entropy_rising", "warning",
        f"{name} rising from step {start:g} with {', '.join(companions)}",
        {"metric": name, "trend": tr.as_dict(), "with": companions, "onset_step": start},
        "Entropy that keeps growing while responses get longer or reward falls points to an "
        "unstable update or reward-driven verbosity.",
        ("?check clip-higher ({clip_high})", "add or raise the KL penalty ({kl_coef})",
         "lower the learning rate ({lr})"), 0.7, step=start)]
