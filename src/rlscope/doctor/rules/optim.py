"""Optimiser rules: value-loss instability, non-finite gradients and a gradient clip that
fires almost every step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlscope.doctor.findings import DoctorConfig, Finding, Unavailable
from rlscope.doctor.rules.common import (
    RuleOut,
    _facts,
    _r,
    _why,
)
from rlscope.doctor.stats import (
    spikes,
)
from rlscope.doctor.table import MetricTable


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


MAX_COUNT = 2.0 ** 53
"""The largest count reported (float sums of counts are exact up to it)."""


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
    # positive counts only, capped: a corrupt log's huge counts overflow their sum to inf
    with np.errstate(over="ignore"):
        skipped = int(min(float(n[bad].sum()), MAX_COUNT))
    return [Finding(
        "nonfinite_gradients", "warning",
        f"{skipped} optimizer steps had a NaN or infinite gradient (skipped), the first at "
        f"step {first:g}",
        {"metric": "optim/nonfinite_steps", "skipped_optimizer_steps": skipped,
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
