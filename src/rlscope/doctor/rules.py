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

from rlscope.doctor.findings import DoctorConfig, Finding, Unavailable
from rlscope.doctor.stats import (
    MIN_WINDOW,
    aligned,
    correlation,
    robust_z,
    slope_interval,
    trend,
    window_size,
)
from rlscope.doctor.table import MetricTable

RuleOut = list[Finding] | Unavailable

ENTROPY = ("policy/entropy", "policy/entropy_sampled")
KL_LAST_PASS = ("policy/kl_behaviour_k3", "policy/approx_kl", "policy/kl_behaviour_k1")
# KL estimates whose expectation is a divergence (≥ 0), so a negative mean is a signal: ours
# to the reference, E_μ[ℓ_μ − ℓ_ref] = KL(μ‖π_ref); verl's actor/ppo_kl, mean(ℓ_old − ℓ_new);
# tinker-cookbook's optim/kl_sample_train_v1, mean(ℓ_sampler − ℓ_train). Our
# policy/kl_behaviour_k1 is E_μ[ℓ − ℓ_μ] = −KL(μ‖π) ≤ 0 by construction and is not checked for
# sign (sampler_mismatch reads its first-pass value).
KL_SIGNED = ("policy/kl_ref_k1", "policy/kl_ref_seq_k1", "actor/ppo_kl",
             "optim/kl_sample_train_v1")
KL_REF = ("policy/kl_ref_seq_k1", "policy/kl_ref_k1", "policy/kl_ref_k3")


def _r(x: float) -> float:
    """Round for evidence (4 significant digits)."""
    return float(f"{x:.4g}")


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
    (≥ 80% of later points, and the last window), with the crossing step and the decay rate
    (slope of log entropy per step up to the crossing). The start is the mean of the first
    three points: a collapse can take only a few steps."""
    name = t.first(*ENTROPY)
    if name is None or not t.has(name, c.min_steps):
        return Unavailable(ENTROPY)
    steps, h = t.series(name)
    w = window_size(len(h))
    start = float(h[:MIN_WINDOW].mean())  # the first few steps: a collapse can be fast
    threshold = max(c.entropy_floor, c.entropy_floor_frac * start)
    below = h < threshold
    if not below[-w:].all():
        return []
    # The crossing is the first point below the threshold from which entropy stays below
    # (≥ 80% of the points from it on); an earlier isolated dip must not hide a later
    # collapse. The last window is all below, so such a point exists.
    frac_below_from = np.cumsum(below[::-1])[::-1] / np.arange(len(h), 0, -1)
    crossing = int(np.argmax(below & (frac_below_from >= 0.8)))
    pre = h[: crossing + 1]
    # No decay rate without points before the crossing (None, not nan: findings.json is JSON).
    rate = _r(float(np.polyfit(steps[: crossing + 1], np.log(np.maximum(pre, 1e-12)), 1)[0])) \
        if crossing >= 2 else None
    return [Finding(
        "entropy_collapse", "warning",
        f"{name} collapsed below {threshold:.3g} at step {steps[crossing]:g}",
        {"metric": name, "start": _r(start), "threshold": _r(threshold),
         "crossing_step": float(steps[crossing]), "last": _r(float(h[-w:].mean())),
         "decay_rate_per_step": rate},
        "The policy became nearly deterministic: it samples almost the same tokens every time, "
        "so groups carry no variance and exploration is lost. Normalised advantages on easy "
        "groups and large learning rates speed this up.",
        ("check sigma_amplification (group std normalisation on easy groups)",
         "lower the learning rate", "add an entropy bonus (--entropy_coef, adaptive control)",
         "use Dr. GRPO centring (--advantage group_center)", "raise clip_high (clip-higher)"),
        0.9, step=float(steps[crossing]))]


def sigma_amplification(t: MetricTable, c: DoctorConfig) -> RuleOut:
    """adv/amplification (mean |A| / mean |r − mean_g|) above the threshold over a stretch of
    steps: standardisation inflates tiny reward gaps. Reports the first step it holds for three
    consecutive steps."""
    if not t.has("adv/amplification", 3):
        return Unavailable(("adv/amplification",))
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
        ("centre without dividing (Dr. GRPO, --advantage group_center)",
         "floor the group std (--adv_std_floor)", "clip advantages (--adv_clip)"),
        0.8, step=float(steps[first]))]


def entropy_rising(t: MetricTable, c: DoctorConfig) -> RuleOut:
    """Entropy trending up beyond noise (slope interval above 0) while length rises or reward
    falls beyond noise."""
    name = t.first(*ENTROPY)
    if name is None or not t.has(name, c.min_steps):
        return Unavailable(ENTROPY)
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
    return [Finding(
        "entropy_rising", "warning", f"{name} rising with {', '.join(companions)}",
        {"metric": name, "trend": tr.as_dict(), "with": companions},
        "Entropy that keeps growing while responses get longer or reward falls points to an "
        "unstable update or reward-driven verbosity.",
        ("check clip-higher (clip_high)", "add or raise the KL penalty", "lower the learning "
         "rate"), 0.7, step=tr.first_step)]


def negative_kl(t: MetricTable, c: DoctorConfig) -> RuleOut:
    """KL estimates whose mean is negative beyond max(kl_negative_tol, 3 standard errors), in
    one finding. The cause is attributed from the recorded sampling config: behaviour ≠ policy
    (filtered sampling without the kept set replayed), else k1 estimator noise when the
    magnitude is small against the spread, else sampler/learner numerics."""
    present = [n for n in KL_SIGNED if t.has(n, 3)]
    if not present:
        return Unavailable(KL_SIGNED)
    negative: dict[str, dict[str, float]] = {}
    noisy = True
    for name in present:
        values = t.values(name)
        mean, se = float(values.mean()), float(values.std() / np.sqrt(len(values)))
        if mean < -max(c.kl_negative_tol, 3 * se):
            negative[name] = {"mean": _r(mean), "stderr": _r(se),
                              "frac_negative_steps": _r(float((values < 0).mean()))}
            noisy = noisy and abs(mean) < values.std()
    if not negative:
        return []
    facts = _facts(t)
    cause = _sampling_cause(facts)
    from_config = cause is not None
    if cause is None:
        cause = ("estimator noise: k1 is negative per sample and its mean is small against "
                 "its spread" if noisy else
                 "the sampler's and the learner's numerics differ (engine mismatch), or the "
                 "logged logprobs are not of the sampling distribution")
    first = next(iter(negative))
    return [Finding(
        "negative_kl", "warning",
        f"{first} is negative on average ({negative[first]['mean']:.3g})"
        + (f" (and {len(negative) - 1} more KL estimates)" if len(negative) > 1 else ""),
        {"metrics": negative, "cause": cause, "sampling": facts.get("sampling", "not recorded")},
        "A KL divergence is never negative; its k1 estimate is negative per sample, but a "
        "sustained negative mean means the two log-prob sets are not of the distributions "
        "they claim. " + cause[0].upper() + cause[1:] + ".",
        ("replay the sampler's kept set (--replay_sampling_mask) or sample without "
         "top-k/top-p", "compare sampler and learner log-probs on the same tokens",
         "use an importance correction (--is_correction token_mask)"),
        0.8 if from_config else 0.5)]


def kl_runaway(t: MetricTable, c: DoctorConfig) -> RuleOut:
    """The sequence KL to the reference far above the adaptive controller's target
    (kl_runaway_factor ×); or, with no target recorded, a per-token KL to the reference trending
    up to kl_runaway_growth × its first window and either above kl_ceiling nats per token or
    accelerating (the slope of the last third kl_acceleration × that of the first two thirds).
    The adaptive β, when logged, is reported alongside."""
    facts = _facts(t)
    target = facts.get("kl_target_value") if facts.get("kl_control") == "adaptive" else None
    name = t.first(*(KL_REF if target else KL_REF[1:]))
    if name is None or not t.has(name, c.min_steps):
        return Unavailable(KL_REF)
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
        ("lower the learning rate", "raise β (--kl_coef) or shorten the controller horizon "
         "(--kl_horizon)", "check that the reward scale is not exploding"),
        0.8, step=tr.first_step)]


def kl_too_small(t: MetricTable, c: DoctorConfig) -> RuleOut:
    """KL to the behaviour policy on the last pass below kl_small per token and not rising,
    the clip fraction ~0, and reward moving within its noise: the update is too conservative.
    Needs a KL measured after an update: an rlscope run with one inner epoch of one minibatch
    measures its last pass before any update (always 0), so the check does not apply."""
    run = t.config.get("config", {}).get("run", {})
    if run and run.get("inner_epochs", 1) == 1 and run.get("num_minibatches", 1) == 1:
        return Unavailable(("a KL measured after an update (inner_epochs or num_minibatches "
                            "> 1)",))
    name = t.first(*KL_LAST_PASS)
    if name is None or not t.has(name, c.min_steps) or not t.has("reward/mean", c.min_steps):
        return Unavailable(("(" + " or ".join(KL_LAST_PASS) + ")", "reward/mean"), all_of=True)
    kl = np.abs(t.values(name))
    if kl[-window_size(len(kl)):].mean() >= c.kl_small or \
            trend(*t.series(name)).direction == "up":
        return []
    if trend(*t.series("reward/mean")).exceeds_noise:
        return []
    clip = t.values("policy/clipfrac_region") if t.has("policy/clipfrac_region") else None
    if clip is not None and clip.mean() > 0.01:
        return []
    return [Finding(
        "kl_too_small", "info", f"updates are tiny ({name} ≈ {kl.mean():.2g}) and reward is flat",
        {"metric": name, "mean_abs": _r(float(kl.mean())),
         "reward_trend": trend(*t.series("reward/mean")).as_dict()},
        "Each update barely moves the policy, so reward cannot move either: the step size, not "
        "the data, limits learning.",
        ("raise the learning rate", "more inner epochs", "a wider clip range"), 0.5)]


def value_instability(t: MetricTable, c: DoctorConfig) -> RuleOut:
    """Value loss spikes (robust z-score above value_spike_z), or explained variance ≤ 0 for
    most of the second half of the run."""
    has_loss, has_ev = t.has("loss/value", c.min_steps), t.has("value/explained_var", c.min_steps)
    if not has_loss and not has_ev:
        return Unavailable(("loss/value", "value/explained_var"))
    evidence: dict[str, Any] = {}
    step = None
    if has_loss:
        steps, loss = t.series("loss/value")
        z = robust_z(loss)
        spikes = z > c.value_spike_z
        if spikes.any():
            evidence["spike_steps"] = [float(s) for s in steps[spikes][:10]]
            evidence["max_robust_z"] = _r(float(z.max()))
            step = float(steps[spikes][0])
    if has_ev:
        ev = t.values("value/explained_var")
        late = ev[len(ev) // 2:]
        if (late <= 0).mean() > 0.8:
            evidence["explained_var_late_mean"] = _r(float(late.mean()))
    if not evidence:
        return []
    return [Finding(
        "value_instability", "warning", "the critic is unstable",
        evidence,
        "The value function cannot track a return that moves with the policy: its loss spikes "
        "or it explains none of the return's variance, so GAE advantages are mostly noise.",
        ("lower the critic's learning rate or vf_coef", "clip the value (--value_clip)",
         "normalise rewards", "fewer inner epochs"), 0.7, step=step)]


def no_signal(t: MetricTable, c: DoctorConfig) -> RuleOut:
    """A high fraction of zero advantages, of zero-std groups (TRL's frac_reward_zero_std,
    1 − group/mixed_rate) or of mixed-group fallbacks in the last window: the data is too easy
    or too hard for the group size."""
    names = ("adv/frac_zero", "frac_reward_zero_std", "group/mixed_rate", "group/fallback")
    name = t.first(*names)
    if name is None or not t.has(name, 3):
        return Unavailable(names)
    values = t.values(name)
    if name == "group/mixed_rate":  # groups with any spread; the rest carry no signal
        values = 1.0 - values
    frac = float(values[-window_size(len(values)):].mean())
    if frac <= c.no_signal_frac:
        return []
    return [Finding(
        "no_signal", "warning", f"{name} = {frac:.2f} in the last window: little to learn from",
        {"metric": name, "last_window_mean": _r(frac), "mean": _r(float(values.mean()))},
        "When every sample of a group gets the same reward, group-relative advantages are zero "
        "and the batch carries no gradient: the prompts are too easy or too hard for the group "
        "size.", ("dynamic sampling of mixed groups (--fill_batch)", "a curriculum",
                  "larger groups"), 0.8)]


def length_hacking(t: MetricTable, c: DoctorConfig) -> RuleOut:
    """Mean length trending beyond noise and correlated with reward (|r| ≥ length_corr)."""
    if not t.has("length/mean", c.min_steps) or not t.has("reward/mean", c.min_steps):
        return Unavailable(("length/mean", "reward/mean"), all_of=True)
    tr = trend(*t.series("length/mean"))
    _, length, reward = aligned(t.series("length/mean"), t.series("reward/mean"))
    corr = correlation(length, reward)
    if not tr.exceeds_noise or abs(corr) < c.length_corr:
        return []
    return [Finding(
        "length_hacking", "warning",
        f"length moves with reward (correlation {corr:.2f}, length {tr.direction})",
        {"length_trend": tr.as_dict(), "correlation": _r(corr)},
        "Reward tracks response length closely, so the policy may be earning reward through "
        "length rather than correctness.",
        ("cap or penalise length (--overlong penalty)", "normalise the reward by length",
         "inspect samples.jsonl for padding or repetition"), 0.5, step=tr.first_step)]


def truncation(t: MetricTable, c: DoctorConfig) -> RuleOut:
    """The truncated fraction (finish reason = length) above clip_ratio in the last window.
    Not applicable to runs whose config records no stop token (fixed-length completions)."""
    if not t.has("length/clip_ratio", 3):
        return Unavailable(("length/clip_ratio",))
    if _facts(t).get("fixed_length"):
        # No stop token: every completion ends at the limit by design.
        return Unavailable(("completions that can stop early (this run has no stop token)",))
    steps, ratio = t.series("length/clip_ratio")
    last = float(ratio[-window_size(len(ratio)):].mean())
    if last <= c.clip_ratio:
        return []
    tr = trend(steps, ratio)
    return [Finding(
        "truncation", "warning", f"{last:.0%} of responses hit the length limit",
        {"metric": "length/clip_ratio", "last_window_mean": _r(last), "trend": tr.as_dict(),
         "note": t.notes.get("length/clip_ratio", "")},
        "Truncated responses get the reward of an unfinished answer, and their advantages "
        "push the policy on text that never reached its end.",
        ("raise the length limit", "an overlong penalty (--overlong penalty)",
         "mask truncated samples (--overlong mask)"), 0.8)]


def sampler_mismatch(t: MetricTable, c: DoctorConfig) -> RuleOut:
    """On an on-policy run the first pass must see ratio 1, no clipping and zero KL; a
    first-pass ratio off by more than mismatch_tol, or sampler/frac_outside_band above
    outside_band, means the logged behaviour log-probs are not the learner's."""
    facts = _facts(t)
    names = ("policy/ratio_mean_first", "sampler/frac_outside_band", "sampler/logp_diff_mean",
             "policy/kl_behaviour_k2_first", "policy/clipfrac_region_first")
    if not any(t.has(n, 3) for n in names):
        return Unavailable(names)
    if facts.get("on_policy") is False:
        return []
    evidence: dict[str, Any] = {}
    if t.has("policy/ratio_mean_first", 3):
        off = np.abs(t.values("policy/ratio_mean_first") - 1.0)
        if off.mean() > c.mismatch_tol:
            evidence["ratio_mean_first_abs_dev"] = _r(float(off.mean()))
    if t.has("sampler/frac_outside_band", 3):
        band = t.values("sampler/frac_outside_band")
        if band.mean() > c.outside_band:
            evidence["frac_outside_band"] = _r(float(band.mean()))
    if t.has("sampler/logp_diff_mean", 3):
        diff = np.abs(t.values("sampler/logp_diff_mean"))
        if diff.mean() > c.mismatch_tol:
            evidence["logp_diff_mean_abs"] = _r(float(diff.mean()))
    if t.has("policy/clipfrac_region_first", 3):
        clipped = t.values("policy/clipfrac_region_first")
        if clipped.mean() > 0:
            evidence["clipfrac_region_first"] = _r(float(clipped.mean()))
    if t.has("policy/kl_behaviour_k2_first", 3):
        k2 = t.values("policy/kl_behaviour_k2_first")
        if k2.mean() > c.mismatch_k2:
            evidence["kl_behaviour_k2_first"] = _r(float(k2.mean()))
    if not evidence:
        return []
    cause = _sampling_cause(facts) or ("numerics of the sampler and the learner differ "
                                       "(dtype, kernels, batch shapes)")
    evidence["cause"] = cause
    evidence["sampling"] = facts.get("sampling", "not recorded")
    return [Finding(
        "sampler_mismatch", "warning", "sampler and learner disagree on the sampled tokens",
        evidence,
        "On-policy, the learner's first pass should reproduce the sampler's log-probs exactly. "
        "It does not: " + cause + ". Ratios, clipping and KL are then measured against the "
        "wrong distribution.",
        ("replay the kept set (--replay_sampling_mask) or sample without top-k/top-p",
         "an importance correction (--is_correction token_truncate)",
         "an fp32 LM head; the same micro-batch sizes in sampler and learner"),
        0.8 if "sampling" in cause else 0.6)]


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
    else:
        return Unavailable(("optim/clip_active", "optim/grad_norm with a recorded clip"))
    frac = float(active.mean())
    if frac <= c.clip_saturation:
        return []
    evidence: dict[str, Any] = {"frac_steps_clipped": _r(frac)}
    if t.has("optim/grad_norm"):
        evidence["grad_norm_median"] = _r(float(np.median(t.values("optim/grad_norm"))))
    return [Finding(
        "grad_clip_saturation", "info", f"the gradient clip fires on {frac:.0%} of steps",
        evidence,
        "With the clip active almost every step, the update size is set by the clip threshold "
        "times the learning rate, not by the gradient: the learning rate no longer means what "
        "it says.", ("lower the learning rate until the clip fires rarely",
                     "or accept the clip as the step-size control and report it"), 0.7)]


def oscillation(t: MetricTable, c: DoctorConfig) -> RuleOut:
    """Reward up and down steps nearly balanced while the trend is flat (variance-limited)."""
    if not t.has("reward/mean", 2 * c.min_steps):
        return Unavailable(("reward/mean",))
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
        ("more generations per prompt", "a larger effective batch", "a lower learning rate"),
        0.5)]


def stale_replay(t: MetricTable, c: DoctorConfig) -> RuleOut:
    """The replay buffer's mean age stale_age steps above the configured delay, or rising."""
    if not t.has("replay/age_mean", 3):
        return Unavailable(("replay/age_mean",))
    delay = _facts(t).get("delay", 0)
    tr = trend(*t.series("replay/age_mean"))
    if tr.last_mean <= delay + c.stale_age and tr.direction != "up":
        return []
    return [Finding(
        "stale_replay", "warning", f"replayed batches are {tr.last_mean:.1f} steps old "
        f"(delay {delay})", {"age_trend": tr.as_dict(), "delay": delay},
        "The bias of replay grows with the age of what is replayed, and the age is set by the "
        "buffer's capacity and priority, not by the delay.",
        ("decay weights by age (fresh_dg, --replay_age_decay)", "a smaller buffer",
         "priority fresh_delight"), 0.7)]


def throughput_regression(t: MetricTable, c: DoctorConfig) -> RuleOut:
    """Step time growing beyond noise (and 20%) together with response length (length
    trending up, correlation ≥ 0.5) where length is logged; evidence: that correlation and
    the generation share of the step. Slower steps at constant length point at the machine
    (other load), not at the run, and are not reported."""
    if not t.has("time/step", c.min_steps):
        return Unavailable(("time/step",))
    tr = trend(*t.series("time/step"))
    if tr.direction != "up" or tr.last_mean < 1.2 * tr.first_mean:
        return []
    evidence: dict[str, Any] = {"trend": tr.as_dict()}
    if t.has("length/mean", c.min_steps):
        _, step_t, length = aligned(t.series("time/step"), t.series("length/mean"))
        corr = correlation(step_t, length)
        if trend(*t.series("length/mean")).direction != "up" or corr < 0.5:
            return []  # slower steps without longer responses: the machine, not the run
        evidence["correlation_with_length"] = _r(corr)
    if t.has("time/sample"):
        _, sample_t, step_t = aligned(t.series("time/sample"), t.series("time/step"))
        evidence["generation_share"] = _r(float(sample_t.sum() / max(step_t.sum(), 1e-12)))
    return [Finding(
        "throughput_regression", "warning",
        f"steps got slower: {tr.first_mean:.3g} s → {tr.last_mean:.3g} s",
        evidence,
        "Step time that grows with response length is the long tail of generation: the slowest "
        "sample sets the step.", ("a length limit", "balance long samples across workers"),
        0.6, step=tr.first_step)]


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
    """Is validation improving beyond noise? First vs last evaluation of the primary validation
    metric, against the spread of evaluations (with at least 3 evaluations), and the best value
    seen."""
    name = primary_validation(t)
    if name is None or not t.has(name, 2):
        return Unavailable(("eval/test_error", "val-core/*", "eval_*"))
    steps, v = t.series(name)
    lower = any(k in name for k in LOWER_IS_BETTER)
    first, last = float(v[0]), float(v[-1])
    gain = (first - last) if lower else (last - first)
    noise = float(np.std(np.diff(v)) / np.sqrt(2)) if len(v) >= 3 else 0.0
    if len(v) < 3:
        verdict = "improving" if gain > 0 else "not improving"
        confidence = 0.4
    elif gain > 2 * noise and gain > 0:
        verdict, confidence = "improving", 0.9
    elif gain < -2 * noise:
        verdict, confidence = "getting worse", 0.8
    else:
        verdict, confidence = "not improving beyond noise", 0.6
    best = float(v.min() if lower else v.max())
    return [Finding(
        "learning_verdict", "info" if verdict == "improving" else "warning",
        f"validation is {verdict}: {name} {first:.4g} → {last:.4g}",
        {"metric": name, "first": _r(first), "last": _r(last), "best": _r(best),
         "evaluations": len(v), "first_step": float(steps[0]), "last_step": float(steps[-1]),
         "noise": _r(noise), "lower_is_better": lower, "verdict": verdict},
        "The verdict compares the first and last evaluations against the evaluation-to-"
        "evaluation noise.", ("keep training" if verdict == "improving" else
                              "check the findings above for the cause",), confidence)]


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
    "oscillation": oscillation,
    "stale_replay": stale_replay,
    "throughput_regression": throughput_regression,
    "learning_verdict": learning_verdict,
}


def diagnose(t: MetricTable, cfg: DoctorConfig | None = None
             ) -> tuple[list[Finding], dict[str, Unavailable]]:
    """Every rule on ``t``: the findings (causes linked) and the rules that could not run."""
    cfg = cfg or DoctorConfig()
    findings: list[Finding] = []
    unavailable: dict[str, Unavailable] = {}
    for rule_id, rule in RULES.items():
        out = rule(t, cfg)
        if isinstance(out, Unavailable):
            unavailable[rule_id] = out
        else:
            findings.extend(out)
    return link_causes(findings), unavailable


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
