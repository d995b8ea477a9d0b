"""KL rules: a sign-flipped (negative) KL, a KL to the reference running away, and updates
too small to move the policy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlscope.doctor.findings import DoctorConfig, Finding, Unavailable
from rlscope.doctor.rules.common import (
    RuleOut,
    _facts,
    _lr,
    _need,
    _r,
    _sampling_cause,
    _section,
)
from rlscope.doctor.stats import (
    growth,
    mean_se,
    onset,
    slope_interval,
    trend,
    window_size,
)
from rlscope.doctor.table import MetricTable

# KL estimates whose expectation is a divergence (≥ 0) once multiplied by their sign, so a
# negative mean of sign × value is a signal: ours to the reference, E_μ[ℓ_μ − ℓ_ref] =
# KL(μ‖π_ref) (sign +1); our KL to the behaviour policy, E_μ[ℓ − ℓ_μ] = −KL(μ‖π) ≤ 0 (sign −1,
# so a positive k1 is the signal), last pass and first pass. The translators store the foreign
# estimates of the same quantity under these names with their sign already flipped to ours
# (verl's actor/ppo_kl, TRL's ppo/policy/policykl and OpenRLHF's ppo_kl = mean(ℓ_old − ℓ_new) →
# policy/kl_behaviour_k1; tinker-cookbook's optim/kl_sample_train_v1, verl's rollout_corr/kl
# and OpenRLHF's vllm_kl = mean(ℓ_sampler − ℓ_learner) → policy/kl_behaviour_k1_first), so
# sign × stored value is the foreign value as logged: the rule never flips a sign twice.
KL_SIGNED: tuple[tuple[str, float], ...] = (
    ("policy/kl_ref_k1", 1.0), ("policy/kl_ref_seq_k1", 1.0),
    ("policy/kl_behaviour_k1", -1.0), ("policy/kl_behaviour_k1_first", -1.0))
KL_REF = ("policy/kl_ref_seq_k1", "policy/kl_ref_k1", "policy/kl_ref_k3")
# KL between the policy before and after (during) the update: how far one update moves it,
# read by magnitude (so the sign convention does not matter). verl's actor/ppo_kl, TRL's
# ppo/policy/policykl and OpenRLHF's ppo_kl arrive as policy/kl_behaviour_k1 (translated), TRL's
# policy/approxkl_avg and ppo/policy/approxkl as policy/approx_kl.
KL_UPDATE = ("policy/kl_behaviour_k3", "policy/approx_kl", "policy/kl_behaviour_k1")
CLIPFRAC = ("policy/clipfrac_region", "policy/clipfrac_high")


def _divergence_label(t: MetricTable, name: str, sign: float) -> str:
    """How a KL estimate is named in the negative-KL finding, in the convention its values are
    reported in (sign × stored, a divergence): the foreign name when the importer translated it
    (its values as logged), else ours with the sign written out."""
    foreign = t.original.get(name)
    if foreign is not None:
        return foreign
    return f"−{name}" if sign < 0 else name


def negative_kl(t: MetricTable, c: DoctorConfig) -> RuleOut:
    """KL estimates whose expectation is a divergence, negative beyond noise: the mean below
    −max(kl_negative_tol, 3 standard errors), or at least kl_dip_frac of the steps dipping far
    below zero (below −max(kl_negative_tol, 4 robust standard deviations)). Reports the mean
    with its standard error and z, the fraction of negative and of far-negative steps, the
    worst dip and its step. A cause is named only when its test passes: the recorded sampling
    config (filtered sampling without the kept set replayed); estimator noise only when the
    mean is within 2 standard errors of zero (so only dips fired); else a systematic gap
    (engine numerics or logprobs not of the sampling distribution)."""
    name0 = _need(t, tuple(n for n, _ in KL_SIGNED), 1)
    if isinstance(name0, Unavailable):
        return name0
    present = [(n, sign) for n, sign in KL_SIGNED if t.has(n)]
    negative: dict[str, dict[str, Any]] = {}
    for name, sign in present:
        steps, stored = t.series(name)
        last = name.removesuffix("_first")
        if last != name and t.has(last) and np.array_equal(t.values(last), stored):
            continue  # one pass per step: the first-pass k1 is the last-pass one, counted once
        values = sign * stored  # the divergence estimate: as a foreign framework logs it
        label = _divergence_label(t, name, sign)
        mean, se = mean_se(values)
        median = float(np.median(values))
        spread = 1.4826 * float(np.median(np.abs(values - median)))
        far = values < -max(c.kl_negative_tol, 4 * spread)
        by_mean = len(values) >= 3 and mean < -max(c.kl_negative_tol, 3 * se)
        by_dips = len(values) >= c.min_steps and far.mean() >= c.kl_dip_frac
        if len(values) < 3 and mean < -max(c.kl_negative_tol, 10 * c.kl_negative_tol):
            by_mean = True  # a point check: one or two steps clearly below zero
        if by_mean or by_dips:
            worst = int(np.argmin(values))
            negative[label] = {
                "stored_as": name, "sign": sign, "mean": _r(mean), "stderr": _r(se),
                "z": _r(mean / se) if se > 0 else None,
                "frac_negative_steps": _r(float((values < 0).mean())),
                "frac_far_below_steps": _r(float(far.mean())),
                "worst": _r(float(values[worst])), "worst_step": float(steps[worst]),
                "first_far_step": float(steps[far][0]) if far.any() else None,
                "fired_by": "mean" if by_mean else "dips"}
    if not negative:
        return []
    facts = _facts(t)
    cause = _sampling_cause(facts)
    from_config = cause is not None
    first = next(iter(negative))
    ev = negative[first]
    within_noise = ev["stderr"] > 0 and abs(ev["mean"]) <= 2 * ev["stderr"]
    if cause is None:
        if within_noise:
            cause = (f"estimator noise: the mean ({ev['mean']:.3g}) is within 2 standard "
                     f"errors ({ev['stderr']:.2g}) of zero; only {ev['frac_far_below_steps']:.0%} "
                     "of steps dip far below it")
        else:
            z = ev["z"]
            cause = ("a systematic gap, not estimator noise (the mean is "
                     + (f"{abs(z):.1f} standard errors" if z is not None else "far")
                     + " below zero): the sampler's and the learner's numerics differ (engine "
                     "mismatch), or the logged logprobs are not of the sampling distribution")
    title = (f"{first} is negative on average ({ev['mean']:.3g} ± {ev['stderr']:.2g})"
             if ev["fired_by"] == "mean" else
             f"{first} dips far below zero on {ev['frac_far_below_steps']:.0%} of steps "
             f"(worst {ev['worst']:.3g} at step {ev['worst_step']:g})")
    if len(negative) > 1:
        title += f" (and {len(negative) - 1} more KL estimates)"
    return [Finding(
        "negative_kl", "warning", title,
        {"metrics": negative, "cause": cause, "sampling": facts.get("sampling", "not recorded")},
        "A KL divergence is never negative; its k1 estimate is negative per sample, but a "
        "sustained negative mean or many deep dips mean the two log-prob sets are not of the "
        "distributions they claim. " + cause[0].upper() + cause[1:] + ".",
        ("?replay the sampler's kept set or sample without top-k/top-p ({sampling_mask})",
         "compare sampler and learner log-probs on the same tokens",
         "?use an importance correction ({is_correction})"),
        0.8 if from_config else (0.4 if within_noise else 0.6),
        step=ev["first_far_step"] if ev["fired_by"] == "dips" else None)]


def kl_runaway(t: MetricTable, c: DoctorConfig) -> RuleOut:
    """The sequence KL to the reference far above the adaptive controller's target
    (kl_runaway_factor ×); or, with no target recorded, a per-token KL to the reference trending
    up to kl_runaway_growth × its first window and either above kl_ceiling nats per token or
    accelerating (the slope of the last third kl_acceleration × that of the first two thirds).
    The adaptive β, when logged, is reported alongside."""
    facts = _facts(t)
    target = facts.get("kl_target_value") if facts.get("kl_control") == "adaptive" else None
    name = _need(t, KL_REF if target else KL_REF[1:], c.min_steps)
    if isinstance(name, Unavailable):
        if not target and t.has("policy/kl_ref_seq_k1") and name.reason == "missing":
            # The per-sequence KL is there; what is missing is a target to compare it with.
            return Unavailable(("policy/kl_ref_k1", "policy/kl_ref_k3"), reason="config",
                               detail="policy/kl_ref_seq_k1 is per sequence and no adaptive "
                                      "KL target is recorded to compare it with (a per-token "
                                      "KL would do without one)")
        return name
    steps, kl = t.series(name)
    tr = trend(steps, kl)
    evidence: dict[str, Any] = {"metric": name, "trend": tr.as_dict()}
    fired = False
    if target and name == "policy/kl_ref_seq_k1":
        if tr.last_mean > c.kl_runaway_factor * target:
            evidence["target"] = target
            fired = True
    elif name != "policy/kl_ref_seq_k1" and tr.direction == "up" \
            and tr.last_mean > c.kl_runaway_growth * max(abs(tr.first_mean), 1e-3):
        # No target: a per-token KL that grew many times over and either passed an absolute
        # ceiling or is accelerating (ordinary growth from ~0 is linear or levels off).
        third = len(kl) // 3
        early = slope_interval(steps[:-third], kl[:-third])[0] if third >= 3 else 0.0
        late = slope_interval(steps[-third:], kl[-third:])[0] if third >= 3 else 0.0
        accelerating = late > c.kl_acceleration * max(early, 0.0) and late > 0
        if tr.last_mean > c.kl_ceiling or accelerating:
            evidence |= {"ceiling": c.kl_ceiling, "slope_early": _r(early),
                         "slope_late": _r(late)}
            fired = True
    if not fired:
        return []
    g = growth(steps, np.maximum(kl, 1e-12), min_factor=c.kl_runaway_growth)
    o = onset(steps, kl)
    start = g.onset_step if g is not None else (o.step if o is not None else tr.first_step)
    evidence["onset_step"] = start
    if g is not None:
        evidence["growth_factor"] = _r(g.factor)
    if t.has("kl_ctrl/beta", c.min_steps):
        beta = trend(*t.series("kl_ctrl/beta"))
        evidence["beta"] = {"first": _r(beta.first_mean), "last": _r(beta.last_mean)}
    headline = (f"{name} is {tr.last_mean:.3g}, {tr.last_mean / target:.1f}× the adaptive "
                f"controller's target {target:g}" if target and "target" in evidence
                else f"{name} ran away: {tr.first_mean:.3g} → {tr.last_mean:.3g}")
    return [Finding(
        "kl_runaway", "critical", headline,
        evidence,
        "The policy moves away from the reference faster than the penalty can hold it: the "
        "reward gradient overwhelms β·KL, typically because the learning rate is too high.",
        ("lower the learning rate ({lr})", "raise the KL coefficient ({kl_coef})",
         "?shorten the KL controller horizon ({kl_horizon})",
         "check that the reward scale is not exploding"),
        0.8, step=start)]


def kl_too_small(t: MetricTable, c: DoctorConfig) -> RuleOut:
    """A point check from one step: the KL between the policy before and after (during) the
    update below kl_small per token on at least kl_small_frac of the steps, not rising beyond
    noise, with the clip fraction ~0 where logged and the reward (where logged) not rising
    beyond noise: each update barely moves the policy. Reports the median and largest |KL|, the
    fraction of tiny steps, the learning rate where logged and the reward's trend (info when
    the reward is not logged: the point check alone). A KL that is zero to float precision
    (median below kl_numeric_zero) was measured before any update and is not used. An rlscope
    run
    with one inner epoch of one minibatch measures its last pass before any update (always 0),
    so the check does not apply there."""
    run = _section(t.config, "config", "run")
    if run and run.get("inner_epochs", 1) == 1 and run.get("num_minibatches", 1) == 1:
        return Unavailable(("a KL measured after an update",), reason="config",
                           detail="inner_epochs = num_minibatches = 1, so the last pass is "
                                  "before any update (raise either to measure it)")
    name = _need(t, KL_UPDATE, 1)
    if isinstance(name, Unavailable):
        return name
    steps, kl = t.series(name)
    kl = np.abs(kl)
    if float(np.median(kl)) < c.kl_numeric_zero:
        # Zero to float precision every step: measured before any update (one epoch of one
        # mini-batch), so it says nothing about the update's size.
        return Unavailable(("a KL measured after an update",), reason="config", detail=(
            f"{name} is {float(np.median(kl)):.1g} (zero to float precision): it is measured "
            "before any update, as with one epoch of one mini-batch"))
    tiny = kl < c.kl_small
    if tiny.mean() < c.kl_small_frac:
        return []
    if len(kl) >= c.min_steps and trend(steps, kl).direction == "up" \
            and kl[-window_size(len(kl)):].mean() >= c.kl_small / 2:
        return []
    clip_name = t.first(*CLIPFRAC)
    clip = float(t.values(clip_name).mean()) if clip_name else None
    if clip is not None and clip > 0.01:
        return []
    shown = t.original.get(name, name)  # verl's actor/ppo_kl, as the user knows it
    evidence: dict[str, Any] = {"metric": name, "median_abs": _r(float(np.median(kl))),
                                "max_abs": _r(float(kl.max())),
                                "frac_steps_below": _r(float(tiny.mean())),
                                "threshold": c.kl_small, "steps": len(kl)}
    if shown != name:
        evidence["as_logged"] = shown  # the size is the same whatever the sign convention
    if clip_name:
        evidence[clip_name] = _r(clip or 0.0)
    lr = _lr(t)
    if lr is not None:
        evidence["lr"] = lr
    reward_note = "reward not logged"
    if t.has("reward/mean", c.min_steps):
        rt = trend(*t.series("reward/mean"))
        evidence["reward_trend"] = rt.as_dict()
        if rt.direction == "up":
            return []  # the reward climbs: the updates, however small, suffice
        reward_note = f"reward {rt.direction}"
    return [Finding(
        "kl_too_small", "warning" if "reward_trend" in evidence else "info",
        f"updates are tiny: |{shown}| ≈ {np.median(kl):.2g} on {tiny.mean():.0%} of "
        f"{len(kl)} steps" + (f" at lr {lr:g}" if lr is not None else "")
        + f" ({reward_note})",
        evidence,
        "Each update barely moves the policy (the KL between the policy before and after it is "
        "orders of magnitude below what a useful step takes), so the step size, not the data, "
        "limits learning.",
        ("raise the learning rate ({lr})", "?more update epochs per batch ({epochs})",
         "?a wider clip range ({clip})"), 0.7 if "reward_trend" in evidence else 0.5,
        step=float(steps[0]))]
