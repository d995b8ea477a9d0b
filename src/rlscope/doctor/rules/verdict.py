"""The learning verdict: is the run still learning, judged on its validation metric (or the
training reward), and the validation metrics it may use.
"""

from __future__ import annotations

import numpy as np

from rlscope.doctor.findings import DoctorConfig, Finding, Unavailable
from rlscope.doctor.rules.common import (
    CORRECTNESS_KEYS,
    RuleOut,
    _r,
    _why,
)
from rlscope.doctor.stats import (
    change_point,
    trend,
    window_size,
)
from rlscope.doctor.table import MetricTable

EVAL_PREFIXES = ("eval/", "val-core/", "val-aux/", "eval_", "test/")
"""Validation metrics. Not "val/": TRL's PPO logs its value function under it."""
LOWER_IS_BETTER = ("error", "loss", "nll", "perplexity")


def validation_metrics(t: MetricTable) -> list[str]:
    return [n for n in t.names() if n.startswith(EVAL_PREFIXES)
            and not n.startswith(("eval/entropy", "eval_runtime", "eval_samples_per_second",
                                  "eval_steps_per_second"))]


def primary_validation(t: MetricTable) -> str | None:
    """The validation metric the verdict is about: our test error, else the first accuracy or
    reward-like mean over evaluations."""
    names = validation_metrics(t)
    for preferred in ("eval/test_error",):
        if preferred in names:
            return preferred
    for key in ("acc", "reward", "score", "pass", "mean@"):
        hits = [n for n in names if key in n]
        if hits:  # the mean over samples (mean@k) before best@k / maj@k summaries
            return min(hits, key=lambda n: ("mean@" not in n, n))
    return names[0] if names else None


def learning_verdict(t: MetricTable, c: DoctorConfig) -> RuleOut:
    """Is the model improving beyond noise? First vs last evaluation of the primary validation
    metric against the spread of evaluations (with at least 3 evaluations), the best value seen
    and where; whether it peaked and fell back (best more than 2 noise units above the last).
    Without validation, the training reward's trend stands in (said so in the evidence).
    `diagnose` then weighs the other findings (collapse, zero-signal groups, plateaus, peaks)
    into the verdict (`weigh_verdict`)."""
    name = primary_validation(t)
    basis = "validation"
    if name is None or not t.has(name, 2):
        if t.has("reward/mean", c.min_steps):
            name, basis = "reward/mean", "training reward (no validation logged)"
        else:
            return _why(t, ("eval/test_error", "val-core/*", "eval_*", "reward/mean"),
                        c.min_steps) if name is None else Unavailable(
                (name,), reason="too_few_steps", detail=f"{name} has 1 evaluation")
    steps, v = t.series(name)
    lower = any(k in name for k in LOWER_IS_BETTER)
    if basis == "validation":
        first, last = float(v[0]), float(v[-1])
        noise = float(np.std(np.diff(v)) / np.sqrt(2)) if len(v) >= 3 else 0.0
        noise_se = 2 * noise
    else:
        tr = trend(steps, v)
        first, last, noise = tr.first_mean, tr.last_mean, tr.noise
        w = window_size(len(v))
        noise_se = 3 * noise * np.sqrt(2.0 / w)
    gain = (first - last) if lower else (last - first)
    if len(v) < 3:
        verdict = "improving" if gain > 0 else "not improving"
        confidence = 0.4
    elif gain > noise_se and gain > 0:
        verdict, confidence = "improving", 0.9
    elif gain < -noise_se:
        verdict, confidence = "getting worse", 0.8
    else:
        verdict, confidence = "not improving beyond noise", 0.6
    # A level shift (a jump within a step or two that then holds) inflates the first window's
    # noise and hides inside it: look for the change point itself, down to a single first step.
    shift = change_point(steps, v, min_segment=1) if (
        verdict == "not improving beyond noise" and len(v) >= 4) else None
    if shift is not None:
        better = (shift.after < shift.before) if lower else (shift.after > shift.before)
        verdict, confidence = ("improving", 0.8) if better else ("getting worse", 0.7)
    if basis != "validation":
        confidence = min(confidence, 0.5)
    best_i = int(np.argmin(v) if lower else np.argmax(v))
    best = float(v[best_i])
    bounded = lower or any(k in name for k in CORRECTNESS_KEYS)
    if basis == "validation" and bounded and (last <= 1e-3 if lower else last >= 0.999):
        verdict, confidence = "solved", 0.9  # at the metric's bound: nothing left to learn
    past_best = (best - last if not lower else last - best) > max(noise_se, 1e-12) \
        and best_i < len(v) - 1 and len(v) >= 3 and basis == "validation"
    if past_best and verdict == "improving":
        verdict = "improved, but past its best"
    return [Finding(
        "learning_verdict", "info" if verdict in ("improving", "solved") else "warning",
        f"{basis.split(' (')[0]} is {verdict}: {name} {first:.4g} → {last:.4g}"
        + (f" (best {best:.4g} at step {steps[best_i]:g})" if past_best else "")
        + (f" (a shift at step {shift.step:g}: {shift.before:.4g} → {shift.after:.4g}, "
           f"{shift.z:.1f} standard errors, then held)" if shift is not None else ""),
        {"metric": name, "basis": basis, "first": _r(first), "last": _r(last),
         "best": _r(best), "best_step": float(steps[best_i]), "evaluations": len(v),
         "first_step": float(steps[0]), "last_step": float(steps[-1]), "noise": _r(noise),
         "lower_is_better": lower, "verdict": verdict,
         **({"shift": {"step": shift.step, "before": _r(shift.before), "after": _r(shift.after),
                       "z": _r(shift.z)}} if shift is not None else {})},
        "The verdict compares the first and last evaluations (or the training reward's first "
        "and last windows) against their noise, or finds the step where the metric shifted to "
        "a new level that held, then weighs the other findings.",
        ("keep training" if verdict == "improving" else
         "stop: the validation metric is at its bound" if verdict == "solved" else
         "check the findings above for the cause",), confidence,
        step=float(steps[best_i]) if past_best else (shift.step if shift is not None else None))]
