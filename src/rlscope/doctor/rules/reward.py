"""Reward rules: sigma amplification, zero-signal groups, length hacking, truncation,
oscillation, a reward that peaked and fell, and a plateau.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlscope.doctor.findings import DoctorConfig, Finding, Unavailable
from rlscope.doctor.rules.common import (
    CORRECTNESS_KEYS,
    RuleOut,
    _facts,
    _need,
    _need_all,
    _r,
    _why,
)
from rlscope.doctor.rules.verdict import LOWER_IS_BETTER, primary_validation
from rlscope.doctor.stats import (
    aligned,
    change_point,
    correlation,
    onset,
    peak_then_fall,
    plateau,
    trend,
    window_size,
)
from rlscope.doctor.table import MetricTable


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
    """Length hacking, named only when its test passes: mean length trending beyond noise, or
    shifting to a new level (a change point: a collapse within a few steps that then holds,
    whose jump inflates the trend's noise), with |correlation| to the reward ≥ length_corr, and
    either the reward is known to depend on length (the run config's task is length-scored) or
    length rises while a correctness metric (accuracy, pass rate, test error) does not improve
    beyond noise. Without either, the rule says so instead of guessing."""
    missing = _need_all(t, ("length/mean", "reward/mean"), c.min_steps)
    if missing is not None:
        return missing
    tr = trend(*t.series("length/mean"))
    direction = tr.direction
    shift = None if tr.exceeds_noise else change_point(*t.series("length/mean"))
    if shift is not None:
        direction = "up" if shift.after > shift.before else "down"
    _, length, reward = aligned(t.series("length/mean"), t.series("reward/mean"))
    corr = correlation(length, reward)
    if direction == "flat" or abs(corr) < c.length_corr:
        return []
    facts = _facts(t)
    evidence: dict[str, Any] = {"length_trend": tr.as_dict(), "correlation": _r(corr)}
    o = onset(*t.series("length/mean"))
    evidence["length_onset_step"] = o.step if o is not None else tr.first_step
    if shift is not None:
        evidence["length_shift"] = {"step": shift.step, "before": _r(shift.before),
                                    "after": _r(shift.after), "z": _r(shift.z)}
        evidence["length_onset_step"] = shift.step
    if facts.get("length_scored"):
        evidence["reward_depends_on_length"] = f"task {facts['task']} is scored by length"
        test = "the task's reward is a function of length (run config)"
    else:
        name = _correctness(t)
        if name is None:
            return Unavailable(("a correctness metric (validation accuracy, pass rate, test "
                                "error) or a length-scored task in the run config",))
        if direction != "up":
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
        f"length moves with reward (correlation {corr:.2f}, length {direction} from step "
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
    records no stop token (fixed-length completions), nor to multi-turn runs (their budgets are
    `turn_budget_exhaustion`'s)."""
    name = _need(t, ("length/clip_ratio",), 1)
    if isinstance(name, Unavailable):
        return name
    if any(n.startswith("episode/truncated_frac/") for n in t.names()):
        return Unavailable(("length/clip_ratio",), reason="config",
                           detail="a multi-turn run: its truncated episodes, by budget, are "
                                  "turn_budget_exhaustion's")
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
