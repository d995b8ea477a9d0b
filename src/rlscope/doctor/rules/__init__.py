"""The doctor's rules (METRICS.md, "The doctor"): pure functions from a table to findings.

Each rule reads canonical metric names (importers translate foreign ones), accepts equivalent
metrics where they exist, and returns its findings, an empty list when the pattern is absent,
or `Unavailable` naming what the log lacks. Thresholds come from `DoctorConfig`. `RULES` is the
registry in the order findings are reported; `diagnose` runs them all and links causes
(``sigma_amplification`` before an ``entropy_collapse`` is its likely cause).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from rlscope.doctor.advice import framework_of, render_action, setting, settings_named
from rlscope.doctor.findings import DoctorConfig, Finding, Unavailable
from rlscope.doctor.stats import (
    MIN_WINDOW,
    aligned,
    correlation,
    growth,
    mean_se,
    onset,
    peak_then_fall,
    plateau,
    slope_interval,
    spikes,
    trend,
    window_size,
)
from rlscope.doctor.table import MetricTable

RuleOut = list[Finding] | Unavailable

ENTROPY = ("policy/entropy", "policy/entropy_sampled")
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
# verl's perf/throughput (all tokens per second per GPU over the whole step) has no equivalent
# in our schema, so the translators keep it under its own name (names/verl.toml says why) and
# the throughput rule reads it as such: only its trend is used.
THROUGHPUT = ("throughput/sample_tokens_per_s", "throughput/learn_tokens_per_s",
              "perf/throughput")
MISMATCH = ("sampler/logp_diff_mean", "policy/kl_behaviour_k2_first",
            "sampler/frac_outside_band", "sampler/logp_diff_max", "policy/kl_behaviour_k1_first")
OFFSET_SHARE = 0.5
"""sampler_mismatch: the share of the mean squared first-pass log-ratio that a constant offset
explains (k1² / 2·k2) above which the cause is a systematic offset, not numerical noise."""
CORRECTNESS_KEYS = ("acc", "correct", "pass@", "pass_rate", "test_error", "solved", "exact")
LENGTH_SCORED_TASKS = ("length_target",)
"""Our tasks whose reward depends on the response length by construction."""


def _r(x: float) -> float:
    """Round for evidence (4 significant digits)."""
    return float(f"{x:.4g}")


def _need(t: MetricTable, names: tuple[str, ...], min_steps: int = 1) -> str | Unavailable:
    """The first of ``names`` with at least ``min_steps`` points; else why not: too few steps
    (naming the metric that is there and its count) or the metrics missing."""
    name = t.first(*names)
    if name is None:
        return Unavailable(names)
    best = max((n for n in names if t.has(n)), key=lambda n: len(t.series(n)[0]))
    if t.has(best, min_steps):
        return next(n for n in names if t.has(n, min_steps))
    return Unavailable((best,), reason="too_few_steps",
                       detail=f"{best} has {len(t.series(best)[0])} logged steps, the check "
                              f"needs {min_steps}")


def _why(t: MetricTable, names: tuple[str, ...], min_steps: int) -> Unavailable:
    """Why none of ``names`` can be used (call when the rule cannot run)."""
    out = _need(t, names, min_steps)
    return out if isinstance(out, Unavailable) else Unavailable(names)


def _need_all(t: MetricTable, names: tuple[str, ...], min_steps: int = 1
              ) -> Unavailable | None:
    """None when every one of ``names`` has ``min_steps`` points; else the missing ones only
    (never a metric that is present), or too few steps."""
    missing = tuple(n for n in names if not t.has(n))
    if missing:
        return Unavailable(missing, all_of=len(missing) > 1)
    short = [n for n in names if not t.has(n, min_steps)]
    if short:
        return Unavailable(tuple(short), reason="too_few_steps", detail=", ".join(
            f"{n} has {len(t.series(n)[0])} logged steps" for n in short)
            + f"; the check needs {min_steps}")
    return None


def _lr(t: MetricTable) -> float | None:
    """The learning rate the log records (its median), or None."""
    if t.has("optim/lr"):
        return float(np.median(t.values("optim/lr")))
    lr = t.config.get("config", {}).get("optim", {}).get("lr")
    return float(lr) if isinstance(lr, (int, float)) else None


def _facts(t: MetricTable) -> dict[str, Any]:
    """What the log's config says about the run (empty for most foreign logs)."""
    cfg = t.config.get("config", {})
    run, sampling = cfg.get("run", {}), cfg.get("sampling", {})
    replay = cfg.get("replay", {})
    spec = t.config.get("method_spec", {})
    facts: dict[str, Any] = {}
    if run:
        facts["delay"] = run.get("delay", 0)
        facts["replay"] = replay.get("replay_capacity", 0) > 0
        facts["on_policy"] = facts["delay"] == 0 and not facts["replay"]
        facts["grad_clip"] = cfg.get("optim", {}).get("grad_clip")
    if sampling:
        facts["sampling"] = {k: sampling.get(k) for k in
                             ("temperature", "top_k", "top_p", "replay_sampling_mask")}
        facts["fixed_length"] = not sampling.get("stop_token_ids")
    task = cfg.get("task")
    if isinstance(task, str):
        facts["task"] = task
        facts["length_scored"] = task in LENGTH_SCORED_TASKS
    kl = spec.get("kl", {})
    if kl:
        facts["kl_control"] = kl.get("control")
        facts["kl_target_value"] = kl.get("target_value")
    return facts


def _sampling_cause(facts: dict[str, Any]) -> str | None:
    """The recorded sampling config that makes the behaviour policy differ from the learner's
    distribution, or None when it records none (or nothing is recorded)."""
    s = facts.get("sampling")
    if not s:
        return None
    filtered = (s.get("top_k") or 0) > 0 or (s.get("top_p") or 1.0) < 1.0
    if filtered and not s.get("replay_sampling_mask", True):
        return (f"sampling filtered the distribution (top_k={s.get('top_k')}, "
                f"top_p={s.get('top_p')}) and the learner does not replay the kept set "
                "(replay_sampling_mask=False), so logprobs are not of the sampling "
                "distribution")
    return None


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


def sigma_amplification(t: MetricTable, c: DoctorConfig) -> RuleOut:
    """adv/amplification (mean |A| / mean |r − mean_g|) above the threshold over a stretch of
    steps: standardisation inflates tiny reward gaps. Reports the first step it holds for three
    consecutive steps."""
    if not t.has("adv/amplification", 3):
        return _why(t, ("adv/amplification",), 3)
    steps, amp = t.series("adv/amplification")
    high = amp > c.amplification
    runs = np.convolve(high.astype(float), np.ones(3), "valid") >= 3
    if not runs.any():
        return []
    first = int(np.argmax(runs))
    evidence: dict[str, Any] = {"metric": "adv/amplification", "first_step": float(steps[first]),
                                "median": _r(float(np.median(amp))),
                                "max": _r(float(amp.max())),
                                "frac_steps_above": _r(float(high.mean()))}
    if t.has("adv/group_std_mean"):
        evidence["group_std_mean_median"] = _r(float(np.median(t.values("adv/group_std_mean"))))
    return [Finding(
        "sigma_amplification", "warning",
        f"advantage normalisation amplifies reward gaps {np.median(amp):.3g}× (median)",
        evidence,
        "Dividing by a small within-group reward std turns tiny reward differences on easy "
        "groups into large advantages, upstream of the clip. The policy then takes large steps "
        "towards whatever the group happened to do, which sharpens it quickly.",
        ("?centre without dividing by the group std, Dr. GRPO ({adv_center})",
         "?floor the group std ({adv_std_floor})", "?clip advantages ({adv_clip})"),
        0.8, step=float(steps[first]))]


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
    run = t.config.get("config", {}).get("run", {})
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


def value_instability(t: MetricTable, c: DoctorConfig) -> RuleOut:
    """Value-loss spikes (robust z-score against the neighbourhood above value_spike_z, a lone
    one above 1.5× that, and at least value_spike_ratio × the neighbourhood's median; their
    steps, the first and the fraction of steps), or explained variance ≤ 0 for most of the
    second half of the run."""
    has_loss, has_ev = t.has("loss/value", c.min_steps), t.has("value/explained_var", c.min_steps)
    if not has_loss and not has_ev:
        return _why(t, ("loss/value", "value/explained_var"), c.min_steps)
    evidence: dict[str, Any] = {}
    step = None
    if has_loss:
        steps, loss = t.series("loss/value")
        sp = spikes(steps, loss, c.value_spike_z, min_ratio=c.value_spike_ratio)
        # One borderline spike in a heavy-tailed loss is noise: alone, it must be 1.5× the bar.
        if len(sp.steps) > 1 or (sp.steps and sp.max_z >= 1.5 * c.value_spike_z):
            evidence["spike_steps"] = list(sp.steps[:10])
            evidence["n_spikes"] = len(sp.steps)
            evidence["frac_steps_spiking"] = _r(sp.frac)
            evidence["max_robust_z"] = _r(sp.max_z)
            step = sp.first_step
    if has_ev:
        ev = t.values("value/explained_var")
        late = ev[len(ev) // 2:]
        if (late <= 0).mean() > 0.8:
            evidence["explained_var_late_mean"] = _r(float(late.mean()))
    if not evidence:
        return []
    title = (f"the critic is unstable: {evidence['n_spikes']} value-loss spikes from step "
             f"{step:g} (robust z up to {evidence['max_robust_z']:.3g})" if step is not None
             else "the critic explains none of the return (explained variance ≤ 0)")
    return [Finding(
        "value_instability", "warning", title,
        evidence,
        "The value function cannot track a return that moves with the policy: its loss spikes "
        "or it explains none of the return's variance, so GAE advantages are mostly noise.",
        ("lower the critic's learning rate ({critic_lr})", "?clip the value ({value_clip})",
         "normalise rewards", "?fewer update epochs ({epochs})"), 0.7, step=step)]


def no_signal(t: MetricTable, c: DoctorConfig) -> RuleOut:
    """A point check from one step: a high fraction of zero advantages, of zero-std groups
    (TRL's frac_reward_zero_std, 1 − group/mixed_rate) or of mixed-group fallbacks in the last
    window: the data is too easy or too hard for the group size. Reports the fraction of steps
    above the threshold and the step from which it stays above."""
    names = ("adv/frac_zero", "frac_reward_zero_std", "group/mixed_rate", "group/fallback")
    name = _need(t, names, 1)
    if isinstance(name, Unavailable):
        return name
    steps, values = t.series(name)
    if name == "group/mixed_rate":  # groups with any spread; the rest carry no signal
        values = 1.0 - values
    frac = float(values[-window_size(len(values)):].mean())
    if frac <= c.no_signal_frac:
        return []
    label = "1 − group/mixed_rate" if name == "group/mixed_rate" else name
    above = values > c.no_signal_frac
    frac_above_from = np.cumsum(above[::-1])[::-1] / np.arange(len(values), 0, -1)
    since = int(np.argmax(above & (frac_above_from >= 0.8))) if above.any() else 0
    return [Finding(
        "no_signal", "warning",
        f"{label} = {frac:.2f} in the last window ({above.mean():.0%} of steps above "
        f"{c.no_signal_frac:g}, from step {steps[since]:g}): little to learn from",
        {"metric": name, "last_window_mean": _r(frac), "mean": _r(float(values.mean())),
         "frac_steps_above": _r(float(above.mean())), "since_step": float(steps[since])},
        "When every sample of a group gets the same reward, group-relative advantages are zero "
        "and the batch carries no gradient: the prompts are too easy or too hard for the group "
        "size.", ("?dynamic sampling of mixed groups ({dynamic_sampling})",
                  "a curriculum of prompts the policy sometimes solves",
                  "larger groups ({group_size})"), 0.8, step=float(steps[since]))]


def _correctness(t: MetricTable) -> str | None:
    """A metric of correctness that does not count length: the primary validation metric when
    it is accuracy-like, else a training metric named like one."""
    val = primary_validation(t)
    if val is not None and any(k in val for k in CORRECTNESS_KEYS):
        return val
    return next((n for n in t.names() if any(k in n.lower() for k in CORRECTNESS_KEYS)
                 and "length" not in n and "len" not in n.split("/")[-1]
                 and not n.startswith(("time/", "timing_s/"))), None)


def length_hacking(t: MetricTable, c: DoctorConfig) -> RuleOut:
    """Length hacking, named only when its test passes: mean length trending beyond noise with
    |correlation| to the reward ≥ length_corr, and either the reward is known to depend on
    length (the run config's task is length-scored) or length rises while a correctness metric
    (accuracy, pass rate, test error) does not improve beyond noise. Without either, the rule
    says so instead of guessing."""
    missing = _need_all(t, ("length/mean", "reward/mean"), c.min_steps)
    if missing is not None:
        return missing
    tr = trend(*t.series("length/mean"))
    _, length, reward = aligned(t.series("length/mean"), t.series("reward/mean"))
    corr = correlation(length, reward)
    if not tr.exceeds_noise or abs(corr) < c.length_corr:
        return []
    facts = _facts(t)
    evidence: dict[str, Any] = {"length_trend": tr.as_dict(), "correlation": _r(corr)}
    o = onset(*t.series("length/mean"))
    evidence["length_onset_step"] = o.step if o is not None else tr.first_step
    if facts.get("length_scored"):
        evidence["reward_depends_on_length"] = f"task {facts['task']} is scored by length"
        test = "the task's reward is a function of length (run config)"
    else:
        name = _correctness(t)
        if name is None:
            return Unavailable(("a correctness metric (validation accuracy, pass rate, test "
                                "error) or a length-scored task in the run config",))
        if tr.direction != "up":
            return []
        ct = trend(*t.series(name)) if t.has(name, 3) else None
        lower = any(k in name for k in LOWER_IS_BETTER)
        improving = ct is not None and ct.direction == ("down" if lower else "up")
        if ct is None or improving:
            return []
        evidence["correctness"] = {"metric": name, "first": _r(ct.first_mean),
                                   "last": _r(ct.last_mean), "direction": ct.direction}
        test = f"length rises while {name} does not improve beyond noise"
    evidence["test"] = test
    return [Finding(
        "length_hacking", "warning",
        f"length moves with reward (correlation {corr:.2f}, length {tr.direction} from step "
        f"{evidence['length_onset_step']:g}) and {test}",
        evidence,
        "The reward tracks response length, and correctness does not explain it: the policy "
        "earns reward through length.",
        ("?cap or penalise length ({overlong_penalty})", "lower the length limit ({max_length})",
         "normalise the reward by length", "inspect samples for padding or repetition"), 0.7,
        step=evidence["length_onset_step"])]


def truncation(t: MetricTable, c: DoctorConfig) -> RuleOut:
    """A point check from one step: the truncated fraction (finish reason = length) above
    clip_ratio in the last window; or, with enough steps, rising beyond noise (slope interval
    above 0) to at least clip_ratio_rising, with its onset. Not applicable to runs whose config
    records no stop token (fixed-length completions)."""
    name = _need(t, ("length/clip_ratio",), 1)
    if isinstance(name, Unavailable):
        return name
    if _facts(t).get("fixed_length"):
        # No stop token: every completion ends at the limit by design.
        return Unavailable(("completions that can stop early",), reason="config",
                           detail="this run has no stop token, so every completion ends at "
                                  "the limit by design")
    steps, ratio = t.series("length/clip_ratio")
    last = float(ratio[-window_size(len(ratio)):].mean())
    tr = trend(steps, ratio)
    rising = len(ratio) >= c.min_steps and tr.direction == "up" and tr.slope_low > 0 \
        and last >= c.clip_ratio_rising
    if last <= c.clip_ratio and not rising:
        return []
    o = onset(steps, ratio) if len(ratio) >= c.min_steps else None
    start = o.step if o is not None else float(steps[0])
    evidence: dict[str, Any] = {"metric": "length/clip_ratio", "last_window_mean": _r(last),
                                "trend": tr.as_dict(), "onset_step": start,
                                "frac_steps_above": _r(float((ratio > c.clip_ratio).mean())),
                                "note": t.notes.get("length/clip_ratio", "")}
    title = (f"{last:.0%} of responses hit the length limit" if last > c.clip_ratio else
             f"responses hitting the length limit rise steadily: {tr.first_mean:.1%} → "
             f"{last:.1%} from step {start:g}")
    return [Finding(
        "truncation", "warning", title, evidence,
        "Truncated responses get the reward of an unfinished answer, and their advantages "
        "push the policy on text that never reached its end.",
        ("raise the length limit ({max_length})", "?an overlong penalty ({overlong_penalty})",
         "?mask truncated samples ({overlong_mask})"), 0.8, step=start)]


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
    minibatches = t.config.get("config", {}).get("run", {}).get("num_minibatches", 1)
    if minibatches > 1:
        # the first pass scores minibatch k after the optimizer steps of minibatches 1..k−1
        return Unavailable(("a first pass before any update",), reason="config", detail=(
            f"num_minibatches = {minibatches}: the first pass of every minibatch after the "
            "first follows an optimizer step, so it is not expected to match the sampler"))
    evidence: dict[str, Any] = {}
    if t.has("policy/ratio_mean_first"):
        off = np.abs(t.values("policy/ratio_mean_first") - 1.0)
        if off.mean() > c.mismatch_tol:
            evidence["ratio_mean_first_abs_dev"] = _r(float(off.mean()))
    if t.has("sampler/frac_outside_band"):
        band = t.values("sampler/frac_outside_band")
        if band.mean() > c.outside_band:
            evidence["frac_outside_band"] = _r(float(band.mean()))
    if t.has("sampler/logp_diff_mean"):
        diff = np.abs(t.values("sampler/logp_diff_mean"))
        if diff.mean() > c.mismatch_tol:
            evidence["logp_diff_mean_abs"] = _r(float(diff.mean()))
    if t.has("policy/clipfrac_region_first"):
        clipped = t.values("policy/clipfrac_region_first")
        if clipped.mean() > 0:
            evidence["clipfrac_region_first"] = _r(float(clipped.mean()))
    if t.has("policy/kl_behaviour_k2_first"):
        k2 = t.values("policy/kl_behaviour_k2_first")
        if k2.mean() > c.mismatch_k2:
            evidence["kl_behaviour_k2_first"] = _r(float(k2.mean()))
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
    share = float(k1.mean()) ** 2 / (2 * float(k2.mean()))
    if share < OFFSET_SHARE:
        return None
    return (f"a systematic offset, not numerical noise: a constant shift of "
            f"{float(k1.mean()):.3g} nats per token explains {min(share, 1.0):.0%} of the mean "
            "squared log-ratio (k1² / 2·k2), as when the sampler draws from a renormalised "
            "distribution (top-k/top-p filtering, a temperature) whose log-probs the learner "
            "does not reproduce")


def nonfinite_gradients(t: MetricTable, c: DoctorConfig) -> RuleOut:
    """Optimizer steps whose gradient norm was NaN or infinite (``optim/nonfinite_steps``,
    which our eager learner skips instead of applying)."""
    if not t.has("optim/nonfinite_steps"):
        return Unavailable(("optim/nonfinite_steps",))
    steps, n = t.series("optim/nonfinite_steps")
    bad = n > 0
    if not bad.any():
        return []
    first = float(steps[bad][0])
    return [Finding(
        "nonfinite_gradients", "warning",
        f"{int(n.sum())} optimizer steps had a NaN or infinite gradient (skipped), the first at "
        f"step {first:g}",
        {"metric": "optim/nonfinite_steps", "skipped_optimizer_steps": int(n.sum()),
         "training_steps_affected": int(bad.sum()), "first_step": first,
         "affected_steps": [float(x) for x in steps[bad][:10]]},
        "A backward pass produced NaN or inf. Applied, it would have made every weight NaN; "
        "skipping keeps the run alive but drops that minibatch's update. Fused attention's "
        "backward on fully padded query rows (left padding) is a known source; overflow in the "
        "loss or the reward is another.",
        ("use --attn_implementation eager (measured: no non-finite step where sdpa had 8 in "
         "100 on the same run)", "check rewards and advantages for inf",
         "lower the learning rate"), 0.8, step=first)]


def grad_clip_saturation(t: MetricTable, c: DoctorConfig) -> RuleOut:
    """The gradient clip active on more than clip_saturation of steps (optim/clip_active, or
    the pre-clip norm against the recorded clip threshold)."""
    facts = _facts(t)
    if t.has("optim/clip_active", c.min_steps):
        active = t.values("optim/clip_active")
    elif t.has("optim/grad_norm", c.min_steps) and facts.get("grad_clip"):
        active = (t.values("optim/grad_norm") > facts["grad_clip"]).astype(float)
    elif t.has("optim/grad_norm", c.min_steps):
        return Unavailable(("optim/grad_norm",), reason="config",
                           detail="the gradient clip threshold is not recorded")
    else:  # missing, or present with too few steps (never "needs" a metric that is there)
        return _why(t, ("optim/clip_active", "optim/grad_norm"), c.min_steps)
    frac = float(active.mean())
    if frac <= c.clip_saturation:
        return []
    clip_steps = t.series("optim/clip_active")[0] if t.has("optim/clip_active", c.min_steps) \
        else t.series("optim/grad_norm")[0]
    evidence: dict[str, Any] = {"frac_steps_clipped": _r(frac),
                                "first_step": float(clip_steps[int(np.argmax(active > 0))])}
    if t.has("optim/grad_norm"):
        evidence["grad_norm_median"] = _r(float(np.median(t.values("optim/grad_norm"))))
    return [Finding(
        "grad_clip_saturation", "info", f"the gradient clip fires on {frac:.0%} of steps",
        evidence,
        "With the clip active almost every step, the update size is set by the clip threshold "
        "times the learning rate, not by the gradient: the learning rate no longer means what "
        "it says.", ("lower the learning rate ({lr}) until the clip ({grad_clip}) fires rarely",
                     "or accept the clip as the step-size control and report it"), 0.7,
        step=evidence["first_step"])]


def oscillation(t: MetricTable, c: DoctorConfig) -> RuleOut:
    """Reward up and down steps nearly balanced while the trend is flat (variance-limited)."""
    name = _need(t, ("reward/mean",), 2 * c.min_steps)
    if isinstance(name, Unavailable):
        return name
    tr = trend(*t.series("reward/mean"))
    moves = tr.ups + tr.downs
    if tr.exceeds_noise or moves == 0 or abs(tr.ups - tr.downs) / moves > c.oscillation_balance:
        return []
    if tr.noise < 1e-9:
        return []
    return [Finding(
        "oscillation", "info", "reward goes up and down with no trend",
        {"trend": tr.as_dict()},
        "Reward moves step to step by about as much in each direction and its windows agree: "
        "learning is limited by the variance of each step's estimate.",
        ("more samples per prompt ({group_size})", "a larger batch ({batch_size})",
         "a lower learning rate ({lr})"), 0.5)]


def stale_replay(t: MetricTable, c: DoctorConfig) -> RuleOut:
    """The replay buffer's mean age stale_age steps above the configured delay, or rising."""
    if not t.has("replay/age_mean", 3):
        return _why(t, ("replay/age_mean",), 3)
    delay = _facts(t).get("delay", 0)
    tr = trend(*t.series("replay/age_mean"))
    if tr.last_mean <= delay + c.stale_age and tr.direction != "up":
        return []
    return [Finding(
        "stale_replay", "warning", f"replayed batches are {tr.last_mean:.1f} steps old "
        f"(delay {delay})", {"age_trend": tr.as_dict(), "delay": delay,
                             "onset_step": o.step if (o := onset(
                                 *t.series("replay/age_mean"))) is not None else None},
        "The bias of replay grows with the age of what is replayed, and the age is set by the "
        "buffer's capacity and priority, not by the delay.",
        ("decay weights by age (fresh_dg, --replay_age_decay)", "a smaller buffer",
         "priority fresh_delight"), 0.7)]


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


def reward_peak_fall(t: MetricTable, c: DoctorConfig) -> RuleOut:
    """The training reward rose to a peak and then gave back at least peak_gain_lost of that
    rise by the last window (peak and falls beyond noise): the peak step, the peak, the last
    window and the fall as a fraction of the peak and of the rise."""
    name = _need(t, ("reward/mean",), 2 * c.min_steps)
    if isinstance(name, Unavailable):
        return name
    steps, r = t.series(name)
    pf = peak_then_fall(steps, r)
    if pf is None or pf.gain_lost < c.peak_gain_lost:
        return []
    return [Finding(
        "reward_peak_fall", "warning",
        f"reward peaked at step {pf.peak_step:g} ({pf.peak:.3g}) then fell by "
        f"{pf.fall_frac:.0%} to {pf.last:.3g} (gave back {pf.gain_lost:.0%} of its rise)",
        {"metric": name, "peak_step": pf.peak_step, "peak": _r(pf.peak), "start": _r(pf.start),
         "last": _r(pf.last), "fall_frac": _r(pf.fall_frac), "gain_lost": _r(pf.gain_lost)},
        "The policy learned and then unlearned: the reward fell from its peak by more than its "
        "noise. An update that became too large (entropy collapse, KL runaway, truncation or a "
        "shifting critic) usually precedes the fall.",
        ("keep the checkpoint nearest the peak step", "lower the learning rate ({lr})",
         "see the findings that start before the peak for the cause"),
        0.7, step=pf.peak_step)]


def reward_plateau(t: MetricTable, c: DoctorConfig) -> RuleOut:
    """The training reward flat (slope within noise) over a trailing stretch of at least
    plateau_frac of the steps: from which step, at which level, and whether it moved before
    (a rise that stopped) or never moved. A reward that never moved is a warning; a rise that
    levelled off is info (the learning curve saturating, or the first sign of a stall: the
    verdict weighs it); a plateau at the reward's ceiling (the logged reward/max) is
    convergence."""
    name = _need(t, ("reward/mean",), 2 * c.min_steps)
    if isinstance(name, Unavailable):
        return name
    steps, r = t.series(name)
    p = plateau(steps, r, min_frac=c.plateau_frac, min_points=c.min_steps)
    if p is None:
        return []
    at_ceiling = False
    if t.has("reward/max"):
        ceiling = float(t.values("reward/max").max())
        at_ceiling = ceiling > 0 and p.level >= 0.95 * ceiling
    what = (f"reward has been flat at {p.level:.3g} since step {p.start_step:g} "
            f"({p.frac:.0%} of the run)" if p.moved_before else
            f"reward never moved beyond its noise ({p.level:.3g} over the whole run)")
    return [Finding(
        "reward_plateau", "warning" if not p.moved_before and not at_ceiling else "info",
        what + (" — at its ceiling" if at_ceiling else ""),
        {"metric": name, "start_step": p.start_step, "end_step": p.end_step,
         "level": _r(p.level), "frac_steps": _r(p.frac), "moved_before": p.moved_before,
         "at_ceiling": at_ceiling},
        "The reward stopped moving: either the task is solved (at its ceiling), or the updates "
        "carry no signal (no variance in groups, collapsed entropy) or are too small.",
        ("check no_signal / entropy_collapse / kl_too_small for the cause",
         "more samples per prompt ({group_size})", "prompts of the right difficulty"),
        0.6, step=p.start_step)]


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
        + (f" (best {best:.4g} at step {steps[best_i]:g})" if past_best else ""),
        {"metric": name, "basis": basis, "first": _r(first), "last": _r(last),
         "best": _r(best), "best_step": float(steps[best_i]), "evaluations": len(v),
         "first_step": float(steps[0]), "last_step": float(steps[-1]), "noise": _r(noise),
         "lower_is_better": lower, "verdict": verdict},
        "The verdict compares the first and last evaluations (or the training reward's first "
        "and last windows) against their noise, then weighs the other findings.",
        ("keep training" if verdict == "improving" else
         "stop: the validation metric is at its bound" if verdict == "solved" else
         "check the findings above for the cause",), confidence,
        step=float(steps[best_i]) if past_best else None)]


RULES: dict[str, Callable[[MetricTable, DoctorConfig], RuleOut]] = {
    "entropy_collapse": entropy_collapse,
    "sigma_amplification": sigma_amplification,
    "entropy_rising": entropy_rising,
    "negative_kl": negative_kl,
    "kl_runaway": kl_runaway,
    "kl_too_small": kl_too_small,
    "value_instability": value_instability,
    "no_signal": no_signal,
    "length_hacking": length_hacking,
    "truncation": truncation,
    "sampler_mismatch": sampler_mismatch,
    "nonfinite_gradients": nonfinite_gradients,
    "grad_clip_saturation": grad_clip_saturation,
    "reward_peak_fall": reward_peak_fall,
    "reward_plateau": reward_plateau,
    "oscillation": oscillation,
    "stale_replay": stale_replay,
    "throughput_regression": throughput_regression,
    "learning_verdict": learning_verdict,
}


def diagnose(t: MetricTable, cfg: DoctorConfig | None = None
             ) -> tuple[list[Finding], dict[str, Unavailable]]:
    """Every rule on ``t``: the findings (causes linked, conflicting advice resolved, the
    verdict weighed, actions named in the source framework's settings) and the rules that
    could not run."""
    cfg = cfg or DoctorConfig()
    findings: list[Finding] = []
    unavailable: dict[str, Unavailable] = {}
    for rule_id, rule in RULES.items():
        out = rule(t, cfg)
        if isinstance(out, Unavailable):
            unavailable[rule_id] = out
        else:
            findings.extend(out)
    findings = weigh_verdict(resolve_conflicts(link_causes(findings)))
    return render_actions(findings, framework_of(t)), unavailable


def render_actions(findings: list[Finding], framework: str) -> list[Finding]:
    """Each action in the source framework's settings (`rlscope.doctor.advice`); an action
    marked optional (``?``) is dropped when the framework has none of its settings."""
    out = []
    for f in findings:
        actions = []
        for a in f.actions:
            template = a.removeprefix("?")
            keys = settings_named(template)
            if a.startswith("?") and keys and not any(setting(framework, k) for k in keys):
                continue  # none of its settings exists in this framework
            actions.append(render_action(template, framework))
        out.append(replace(f, actions=tuple(actions),
                           evidence=f.evidence | {"framework": framework}))
    return out


LOWER_LR = "lower the learning rate"


def resolve_conflicts(findings: list[Finding]) -> list[Finding]:
    """Advice that contradicts another finding is removed, with the reason in the evidence: a
    run whose updates are already tiny (kl_too_small) is never told to lower the learning rate;
    a reward that peaked and fell or plateaued is not also called an oscillation; a pointer to
    sigma_amplification is dropped where that rule did not fire."""
    ids = {f.id for f in findings}
    out = []
    for f in findings:
        if f.id == "oscillation" and ids & {"reward_peak_fall", "reward_plateau"}:
            continue
        if "sigma_amplification" not in ids:  # nothing to check: the rule did not fire
            f = replace(f, actions=tuple(a for a in f.actions
                                         if not a.startswith("check sigma_amplification")))
        if "kl_too_small" in ids and f.id != "kl_too_small":
            kept = tuple(a for a in f.actions if not a.startswith(LOWER_LR))
            if kept != f.actions:
                f = replace(f, actions=kept, evidence=f.evidence | {
                    "advice_removed": "lowering the learning rate: kl_too_small shows the "
                                      "updates are already tiny"})
        out.append(f)
    return out


def weigh_verdict(findings: list[Finding]) -> list[Finding]:
    """The verdict weighs peaks, plateaus, collapse and zero-signal fractions: an improving
    run with an entropy collapse and mostly zero-variance groups is stalling, not one to keep
    training; one whose reward peaked and fell is past its best; a long plateau is named.
    Says which findings it weighed."""
    by_id = {f.id: f for f in findings}
    verdict = by_id.get("learning_verdict")
    if verdict is None:
        return findings
    weighed: dict[str, Any] = {}
    reasons: list[str] = []
    collapse, nosig = by_id.get("entropy_collapse"), by_id.get("no_signal")
    if collapse is not None:
        weighed["entropy_collapse_step"] = collapse.step
    if nosig is not None:
        weighed["zero_signal_frac"] = nosig.evidence.get("last_window_mean")
    if collapse is not None and nosig is not None and verdict.evidence["verdict"] != "solved":
        reasons.append(f"entropy collapsed at step {collapse.step:g} and "
                       f"{nosig.evidence.get('last_window_mean', 0):.0%} of groups carry no "
                       "reward variance: further steps carry little gradient")
    caveats: list[str] = []
    on_reward = verdict.evidence.get("basis", "validation") != "validation"
    peak = by_id.get("reward_peak_fall")
    if peak is not None:
        weighed["reward_peak_step"] = peak.evidence["peak_step"]
        weighed["reward_fall_frac"] = peak.evidence["fall_frac"]
        (reasons if on_reward else caveats).append(
            f"the training reward peaked at step {peak.evidence['peak_step']:g} and fell by "
            f"{peak.evidence['fall_frac']:.0%}")
    flat = by_id.get("reward_plateau")
    if flat is not None and not flat.evidence.get("at_ceiling"):
        weighed["plateau_since_step"] = flat.evidence["start_step"]
        weighed["plateau_frac"] = flat.evidence["frac_steps"]
        (reasons if on_reward else caveats).append(
            f"the training reward has been flat since step {flat.evidence['start_step']:g} "
            f"({flat.evidence['frac_steps']:.0%} of the run)")
    tiny = by_id.get("kl_too_small")
    if tiny is not None:
        weighed["kl_too_small_median"] = tiny.evidence.get("median_abs")
        shown = tiny.evidence.get("as_logged", tiny.evidence["metric"])
        caveats.append(f"updates are tiny (|{shown}| ≈ "
                       f"{tiny.evidence.get('median_abs', 0):.2g}): progress is limited by "
                       "the step size")
    if not weighed:
        return findings
    ev = verdict.evidence | {"weighed": weighed}
    actions = verdict.actions
    title, severity = verdict.title, verdict.severity
    if caveats:
        ev["caveats"] = caveats
        actions = tuple(a if a != "keep training" else
                        "keep training, but mind: " + "; ".join(caveats) for a in actions)
    if reasons:
        actions = ("fix what stalls it before training longer: " + "; ".join(reasons),
                   *[a for a in actions if not a.startswith("keep training")])
        if ev["verdict"] == "improving":
            ev["verdict"] = "improving, but stalling"
            title = title.replace("is improving", "is improving, but stalling")
            severity = "warning"
        ev["stalled_by"] = reasons
    new = replace(verdict, title=title, severity=severity, evidence=ev, actions=actions)
    return [new if f is verdict else f for f in findings]


def link_causes(findings: list[Finding]) -> list[Finding]:
    """An entropy collapse preceded by sigma amplification lists it as the likely cause."""
    amp = [f for f in findings if f.id == "sigma_amplification"]
    linked = []
    for f in findings:
        if f.id == "entropy_collapse" and amp and (
                amp[0].step is None or f.step is None or amp[0].step <= f.step):
            f = replace(f, causes=("sigma_amplification",))
        linked.append(f)
    return linked
