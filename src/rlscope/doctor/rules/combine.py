"""After every rule ran: causes linked, contradicting advice removed, the verdict weighed, and
each action written in the source framework's settings.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rlscope.doctor.advice import render_action, setting, settings_named
from rlscope.doctor.findings import Finding


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
    if collapse is not None and nosig is None and verdict.evidence["verdict"] != "solved":
        shift = verdict.evidence.get("shift")
        caveats.append(f"entropy collapsed at step {collapse.step:g}: the policy has almost "
                       "stopped exploring"
                       + (f", and the gain came as one shift at step {shift['step']:g} that "
                          "then held" if shift else ""))
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
