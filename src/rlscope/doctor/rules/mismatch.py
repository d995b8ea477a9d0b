"""Off-policy rules: the sampler's distribution differing from the learner's, and a replay
buffer gone stale.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rlscope.doctor.findings import DoctorConfig, Finding, Unavailable
from rlscope.doctor.rules.common import (
    RuleOut,
    _facts,
    _need,
    _r,
    _sampling_cause,
    _section,
    _why,
)
from rlscope.doctor.stats import (
    aligned,
    growth,
    onset,
    trend,
)
from rlscope.doctor.table import MetricTable
from rlscope.results import finite

MISMATCH = ("sampler/logp_diff_mean", "policy/kl_behaviour_k2_first",
            "sampler/frac_outside_band", "sampler/logp_diff_max", "policy/kl_behaviour_k1_first")
OFFSET_SHARE = 0.5
"""sampler_mismatch: the share of the mean squared first-pass log-ratio that a constant offset
explains (k1² / 2·k2) above which the cause is a systematic offset, not numerical noise."""


def sampler_mismatch(t: MetricTable, c: DoctorConfig) -> RuleOut:
    """A point check from one step: on an on-policy run the first pass must see ratio 1, no
    clipping and zero KL; a first-pass ratio off by more than mismatch_tol, sampler/logp_diff
    or the first-pass k1 (|mean|) or k2 above their thresholds, or sampler/frac_outside_band
    above outside_band, means the logged behaviour log-probs are not the learner's. A mismatch
    metric that grows mismatch_growth times over is reported with its onset step and factor.
    The cause: the recorded sampling config; else a systematic offset when its test passes
    (`_offset_cause`); else numerics."""
    facts = _facts(t)
    names = ("policy/ratio_mean_first", "sampler/frac_outside_band", "sampler/logp_diff_mean",
             "policy/kl_behaviour_k2_first", "policy/clipfrac_region_first",
             "policy/kl_behaviour_k1_first")
    found = _need(t, names, 1)
    if isinstance(found, Unavailable):
        return found
    if facts.get("on_policy") is False:
        return []
    minibatches = _section(t.config, "config", "run").get("num_minibatches", 1)
    if (finite(minibatches) or 1) > 1:
        # the first pass scores minibatch k after the optimizer steps of minibatches 1..k−1
        return Unavailable(("a first pass before any update",), reason="config", detail=(
            f"num_minibatches = {minibatches}: the first pass of every minibatch after the "
            "first follows an optimizer step, so it is not expected to match the sampler"))
    evidence: dict[str, Any] = {}
    # (metric, evidence key, its distance from the on-policy value, the limit of its mean)
    gaps: tuple[tuple[str, str, Callable[[np.ndarray], np.ndarray], float], ...] = (
        ("policy/ratio_mean_first", "ratio_mean_first_abs_dev", lambda v: np.abs(v - 1.0),
         c.mismatch_tol),
        ("sampler/frac_outside_band", "frac_outside_band", lambda v: v, c.outside_band),
        ("sampler/logp_diff_mean", "logp_diff_mean_abs", np.abs, c.mismatch_tol),
        ("policy/clipfrac_region_first", "clipfrac_region_first", lambda v: v, 0.0),
        ("policy/kl_behaviour_k2_first", "kl_behaviour_k2_first", lambda v: v, c.mismatch_k2),
    )
    for name, key, distance, limit in gaps:
        if t.has(name):
            gap = float(distance(t.values(name)).mean())
            if gap > limit:
                evidence[key] = _r(gap)
    if t.has("policy/kl_behaviour_k1_first"):
        # first-pass k1 (tinker-cookbook's kl_sample_train_v1, verl's rollout_corr/kl and
        # OpenRLHF's vllm_kl, sign flipped to ours): 0 on an on-policy step
        k1 = t.values("policy/kl_behaviour_k1_first")
        if np.abs(k1).mean() > c.mismatch_tol:
            evidence["kl_behaviour_k1_first_mean"] = _r(float(k1.mean()))
    step = None
    for name in MISMATCH:
        if t.has(name, c.min_steps):
            s_, v = t.series(name)
            g = growth(s_, np.abs(v), min_factor=c.mismatch_growth)
            if g is not None and g.factor > 1:
                evidence["growth"] = {"metric": name, "onset_step": g.onset_step,
                                      "factor": _r(g.factor), "before": _r(g.before),
                                      "after": _r(g.after)}
                step = g.onset_step
                break
    if not evidence or (list(evidence) == ["growth"] and evidence["growth"]["after"] < (
            c.mismatch_k2 if evidence["growth"]["metric"].endswith("k2_first")
            else c.mismatch_tol)):
        return []
    cause = _sampling_cause(facts) or _offset_cause(t) or (
        "numerics of the sampler and the learner differ (dtype, kernels, batch shapes)")
    evidence["cause"] = cause
    evidence["sampling"] = facts.get("sampling", "not recorded")
    g_ev = evidence.get("growth")
    title = "sampler and learner disagree on the sampled tokens" + (
        f"; {g_ev['metric']} grew {g_ev['factor']:.3g}× from step {g_ev['onset_step']:g}"
        if g_ev else "")
    return [Finding(
        "sampler_mismatch", "warning", title,
        evidence,
        "On-policy, the learner's first pass should reproduce the sampler's log-probs exactly. "
        "It does not: " + cause + ". Ratios, clipping and KL are then measured against the "
        "wrong distribution.",
        ("?replay the sampler's kept set or sample without top-k/top-p ({sampling_mask})",
         "?an importance correction ({is_correction})",
         "an fp32 LM head; the same micro-batch sizes in sampler and learner"),
        0.8 if "sampling" in cause else 0.6, step=step)]


def _offset_cause(t: MetricTable) -> str | None:
    """A systematic offset between the sampler's and the learner's log-probs, named only when
    its test passes: with Δ = ℓ_learner − ℓ_sampler per token on the first pass, k1 = E[Δ] and
    k2 = ½E[Δ²], the share k1² / 2·k2 of the mean squared log-ratio that a constant offset
    explains is at least OFFSET_SHARE (numerical noise is zero-mean: its k1 ≈ −k2, a share
    ≈ k2/2 ≈ 0). Every token shifted alike is what a renormalised sampler gives (top-k/top-p
    filtering or a temperature the learner does not apply). None without both metrics."""
    if not (t.has("policy/kl_behaviour_k1_first") and t.has("policy/kl_behaviour_k2_first")):
        return None
    _, k1, k2 = aligned(t.series("policy/kl_behaviour_k1_first"),
                        t.series("policy/kl_behaviour_k2_first"))
    if len(k1) == 0 or float(k2.mean()) <= 0:
        return None
    m1, m2 = float(k1.mean()), float(k2.mean())
    share = m1 * m1 / (2 * m2)  # not m1 ** 2: a float power overflowing raises OverflowError
    if not share >= OFFSET_SHARE:  # NaN (inf / inf) included
        return None
    return (f"a systematic offset, not numerical noise: a constant shift of "
            f"{m1:.3g} nats per token explains {min(share, 1.0):.0%} of the mean "
            "squared log-ratio (k1² / 2·k2), as when the sampler draws from a renormalised "
            "distribution (top-k/top-p filtering, a temperature) whose log-probs the learner "
            "does not reproduce")


def stale_replay(t: MetricTable, c: DoctorConfig) -> RuleOut:
    """Replayed batches stale_age steps older than the configured delay, or growing older.
    Reads the age of the batch each step trained on (``replay/age``) where it is logged, else
    the buffer's mean age; the warm-up steps before the delay are left out (a buffer filling
    up ages by construction)."""
    name = "replay/age" if t.has("replay/age", 3) else "replay/age_mean"
    if not t.has(name, 3):
        return _why(t, ("replay/age", "replay/age_mean"), 3)
    delay = _facts(t).get("delay", 0)
    steps, ages = t.series(name)
    keep = steps >= delay
    if keep.sum() < 3:
        return Unavailable((name,), reason="too_few_steps",
                           detail=f"{name} has fewer than 3 steps after the delay ({delay})")
    steps, ages = steps[keep], ages[keep]
    tr = trend(steps, ages)
    growing = tr.direction == "up" and tr.last_mean > delay + 1
    if tr.last_mean <= delay + c.stale_age and not growing:
        return []
    return [Finding(
        "stale_replay", "warning", f"replayed batches are {tr.last_mean:.1f} steps old "
        f"(delay {delay})", {"metric": name, "age_trend": tr.as_dict(), "delay": delay,
                             "onset_step": o.step if (o := onset(steps, ages)) is not None
                             else None},
        "The bias of replay grows with the age of what is replayed, and the age is set by the "
        "buffer's capacity and priority, not by the delay.",
        ("decay weights by age (fresh_dg, --replay_age_decay)", "a smaller buffer",
         "priority fresh_delight"), 0.7)]
