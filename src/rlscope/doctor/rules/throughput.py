"""Timing rules: a throughput that regresses over the run; data-parallel ranks whose step
times diverge.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlscope.doctor.findings import DoctorConfig, Finding
from rlscope.doctor.rules.common import (
    RuleOut,
    _need_all,
    _r,
    _why,
)
from rlscope.doctor.stats import (
    aligned,
    correlation,
    onset,
    trend,
)
from rlscope.doctor.table import MetricTable

# verl's perf/throughput (all tokens per second per GPU over the whole step) has no equivalent
# in our schema, so the translators keep it under its own name (names/verl.toml says why) and
# the throughput rule reads it as such: only its trend is used.
THROUGHPUT = ("throughput/sample_tokens_per_s", "throughput/learn_tokens_per_s",
              "perf/throughput")


def throughput_regression(t: MetricTable, c: DoctorConfig) -> RuleOut:
    """Step time growing beyond noise (and throughput_drop) together with response length
    (length trending up, correlation ≥ 0.5) where length is logged; or a logged throughput
    (tokens per second) falling beyond noise by throughput_drop, with the step its fall starts
    (onset), where length is not logged or rises. Evidence: the correlation with length and the
    generation share of the step. Slower steps or fewer tokens per second at constant length
    point at the machine (other load), not at the run, and are not reported."""
    tp_name = t.first(*THROUGHPUT)
    if not t.has("time/step", c.min_steps) and (tp_name is None or not t.has(tp_name,
                                                                               c.min_steps)):
        return _why(t, ("time/step", *THROUGHPUT), c.min_steps)
    evidence: dict[str, Any] = {}
    headline = ""
    step = None
    if tp_name and t.has(tp_name, c.min_steps):
        steps, tp = t.series(tp_name)
        tt = trend(steps, tp)
        length_flat = t.has("length/mean", c.min_steps) and \
            trend(*t.series("length/mean")).direction != "up"
        if tt.direction == "down" and tt.last_mean < (1 - c.throughput_drop) * tt.first_mean \
                and not length_flat:  # fewer tokens/s at the same lengths: the machine
            o = onset(steps, tp)
            step = o.step if o is not None else tt.first_step
            evidence["throughput"] = {"metric": tp_name, "first": _r(tt.first_mean),
                                      "last": _r(tt.last_mean), "onset_step": step,
                                      "fall": _r(1 - tt.last_mean / tt.first_mean)}
            headline = (f"throughput fell {1 - tt.last_mean / tt.first_mean:.0%} "
                        f"({tp_name} {tt.first_mean:.3g} → {tt.last_mean:.3g}) from step "
                        f"{step:g}")
    if t.has("time/step", c.min_steps):
        tr = trend(*t.series("time/step"))
        if tr.direction == "up" and tr.last_mean >= (1 + c.throughput_drop) * tr.first_mean:
            ok = True
            if t.has("length/mean", c.min_steps):
                _, step_t, length = aligned(t.series("time/step"), t.series("length/mean"))
                corr = correlation(step_t, length)
                if trend(*t.series("length/mean")).direction != "up" or corr < 0.5:
                    ok = False  # slower steps without longer responses: the machine
                else:
                    evidence["correlation_with_length"] = _r(corr)
            if ok:
                evidence["trend"] = tr.as_dict()
                if not headline:
                    o = onset(*t.series("time/step"))
                    step = o.step if o is not None else tr.first_step
                    headline = (f"steps got slower: {tr.first_mean:.3g} s → "
                                f"{tr.last_mean:.3g} s from step {step:g}")
    if not headline:
        return []
    if t.has("time/sample") and t.has("time/step"):
        _, sample_t, step_t = aligned(t.series("time/sample"), t.series("time/step"))
        evidence["generation_share"] = _r(float(sample_t.sum() / max(step_t.sum(), 1e-12)))
    return [Finding(
        "throughput_regression", "warning", headline, evidence,
        "Step time that grows with response length is the long tail of generation: the slowest "
        "sample sets the step. Falling tokens per second at the same work is a slower "
        "generation or training phase (longer tails, memory pressure, preemption).",
        ("a length limit ({max_length})", "balance long samples across workers"),
        0.6, step=step)]


RANK_PHASES = ("time/step", "time/sample", "time/score", "time/ref", "time/learn")
"""The timings a data-parallel run logs per step as the slowest rank's, each beside its mean
over ranks ``<name>_mean`` (rlscope.distributed)."""


def rank_imbalance(t: MetricTable, c: DoctorConfig) -> RuleOut:
    """Data-parallel ranks out of step: the slowest rank's step time (``time/step``) above
    the mean over ranks (``time/step_mean``) by more than rank_imbalance in the median step
    (at least min_steps steps), the phase with the largest median gap named (sampling: long
    completions on one rank; learning: uneven rows after selection) and the first step above
    the threshold. Every rank waits for the slowest at each collective, so the gap is time
    the other ranks idle. A single-process run logs ``time/step`` and no ``*_mean``: no
    finding (nothing to compare)."""
    if t.has("time/step") and t.first("time/step_mean", "time/sample_mean",
                                      "time/learn_mean") is None:
        return []  # one process: nothing to compare
    missing = _need_all(t, ("time/step", "time/step_mean"), c.min_steps)
    if missing is not None:
        return missing
    gaps: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for phase in RANK_PHASES:
        if t.has(phase, c.min_steps) and t.has(f"{phase}_mean", c.min_steps):
            steps, slowest, mean = aligned(t.series(phase), t.series(f"{phase}_mean"))
            gaps[phase] = steps, slowest / np.maximum(mean, 1e-12) - 1.0
    steps, gap = gaps["time/step"]
    median = float(np.median(gap))
    if median <= c.rank_imbalance:
        return []
    worst = max((p for p in gaps if p != "time/step"), default="time/step",
                key=lambda p: float(np.median(gaps[p][1])))
    first = float(steps[np.argmax(gap > c.rank_imbalance)])
    evidence: dict[str, Any] = {
        "median_gap": _r(median), "max_gap": _r(float(gap.max())),
        "worst_phase": worst, "worst_phase_median_gap": _r(float(np.median(gaps[worst][1]))),
        "steps_above": _r(float((gap > c.rank_imbalance).mean()))}
    return [Finding(
        "rank_imbalance", "warning",
        f"data-parallel ranks out of step: the slowest rank's step is {median:.0%} above the "
        f"mean in the median step, most in {worst}", evidence,
        "Every rank waits for the slowest one at each gradient sum and gather, so the gap is "
        "time the other ranks idle. Uneven sampling (one rank's completions run long), "
        "uneven learner rows after selection, or a slower or shared device cause it.",
        ("balance long samples across ranks (a length limit ({max_length}))",
         "give each rank a dedicated device and CPU cores"),
        0.6, step=first)]
