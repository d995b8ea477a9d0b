"""The preset registry rendered for people: ``rlscope methods [NAME]`` and ``docs/methods.md``.

    python -m rlscope.methods.catalog > docs/methods.md     (kept in sync by a test)

`summary` is a preset's components on one line, `describe` a preset in full: every component
with the first paragraph of its docstring, the settings that component reads with their
values and the flag that overrides each, the source, the valid regime and what a run needs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from rlscope.methods import METHODS, canonical_method_name
from rlscope.methods.advantages import ADVANTAGES
from rlscope.methods.corrections import CORRECTIONS
from rlscope.methods.gates import GATES
from rlscope.methods.objectives import OBJECTIVES
from rlscope.methods.spec import MethodSpec

# The settings each component reads: (config field, command-line flag or "" when it has none).
_DG = (("eta", "eta"),)
GATE_SETTINGS: dict[str, tuple[tuple[str, str], ...]] = {
    "delight": _DG,
    "uncertainty_shift": (*_DG, ("s", "uncertainty_scale")),
    "uncertainty_filter": (*_DG, ("tau", "filter_tau")),
    "uncertainty_shrink": (*_DG, ("s", "uncertainty_scale")),
    "entropy_guard": (*_DG, ("guard_scale", "guard_scale")),
    "freshness": (*_DG, ("gate_age_decay", "replay_age_decay")),
}
_CLIP = (("clip_low", "clip_low"), ("clip_high", "clip_high"), ("dual_clip", "dual_clip"))
_TPO = (("tpo_eta", "tpo_eta"),)
OBJECTIVE_SETTINGS: dict[str, tuple[tuple[str, str], ...]] = {
    "is_capped": (("cap", "is_cap"),),
    "traj_is_capped": (("cap", "is_cap"),),
    "ppo_clip": _CLIP,
    "gspo": _CLIP,
    "cispo": (("cispo_max", "cispo_max"),),
    "aspo": _CLIP[:2],
    "r2vpo": (("r2vpo_lambda", "r2vpo_lambda"),),
    "sapo": (("sapo_tau_pos", ""), ("sapo_tau_neg", "")),
    "dro": (("dro_beta", "dro_beta"),),
    "pmd_mean": (("pmd_tau", ""),),
    "tpo": _TPO,
    "tpo_no_anchor": _TPO,
    "group_pg": _TPO,
    "tpo_full_action": _TPO,
    "tpo_token": _TPO,
    "grpo_token": (*_CLIP[:2], ("candidate_kl", "candidate_kl")),
    "self_distill": (("distill_alpha", "distill_alpha"),),
    "scope_lite": (("distill_alpha", "distill_alpha"),),
}
_ADV_COMMON = (("std_floor", "adv_std_floor"), ("clip", "adv_clip"))
ADVANTAGE_SETTINGS: dict[str, tuple[tuple[str, str], ...]] = {
    "gae": (("gamma", "gamma"), ("lam", "lam"), *_ADV_COMMON),
    "reinforce_pp": (("gamma", "gamma"), *_ADV_COMMON),
    "reinforce_pp_baseline": (("gamma", "gamma"), *_ADV_COMMON),
}
KL_SETTINGS = (("coef", "kl_coef"), ("estimator", "kl_estimator"), ("target", "kl_target"),
               ("place", "kl_place"), ("control", "kl_control"))
CONTROL_KL_SETTINGS = {
    "adaptive": (("target_value", "kl_target_value"), ("horizon", "kl_horizon")),
    "warmup": (("warmup_steps", "kl_warmup_steps"),),
}
ENTROPY_SETTINGS = (("control", "entropy_control"), ("target", "entropy_target"),
                    ("delta", "entropy_delta"), ("window", "entropy_window"))
OWN_CREDIT = frozenset({"tpo", "tpo_no_anchor", "group_pg", "tpo_full_action", "tpo_token",
                        "grpo_token", "pmd_mean", "ce_oracle"})
"""Objectives that compute their own credit from rewards or labels and ignore the advantage."""
CORRECTION_SETTINGS = (("cap", "is_correction_cap"), ("band_low", "is_band_low"),
                       ("band_high", "is_band_high"), ("geometric", "is_geometric"))


def kl_summary(spec: MethodSpec) -> str:
    k = spec.kl
    if k.coef <= 0:
        return "—"
    return f"{k.estimator} to {k.target} in the {k.place}, β={k.coef:g} ({k.control})"


def objective_summary(spec: MethodSpec) -> str:
    o = spec.objective
    if o.name in ("ppo_clip", "gspo", "aspo", "grpo_token"):
        return f"{o.name} ε {o.clip_low:g}/{o.clip_high:g}"
    if o.name in ("is_capped", "traj_is_capped"):
        return f"{o.name} (cap {o.cap:g})"
    return o.name


def needs(spec: MethodSpec) -> str:
    """What a run must provide, comma-separated ("—" when nothing)."""
    return ", ".join(spec.requires + (("groups",) if spec.grouped else ())
                     + (("critic",) if spec.needs_value else ())) or "—"


def selection_summary(spec: MethodSpec) -> str:
    parts = [spec.selection]
    if spec.selection == "kondo":
        parts[0] = f"kondo (keep {spec.keep_ratio:g})"
    if spec.overlong.name != "none":
        parts.append(f"overlong {spec.overlong.name}")
    return " + ".join(parts)


def summary(spec: MethodSpec) -> str:
    """The preset's components on one line: advantage · gate · objective · agg · KL · selection
    (a gate of none, no KL and no selection are left out)."""
    parts = [spec.advantage.name]
    if spec.gate.name != "none":
        parts.append(spec.gate.name)
    parts += [objective_summary(spec), spec.agg]
    if spec.kl.coef > 0:
        parts.append(f"KL {spec.kl.estimator}→{spec.kl.target} β {spec.kl.coef:g}")
    if spec.selection != "none" or spec.overlong.name != "none":
        parts.append(selection_summary(spec))
    return " · ".join(parts)


def render_list() -> str:
    """``rlscope methods``: every preset, its components on one line, its description below."""
    width = max(map(len, METHODS)) + 2
    lines = ["update-rule presets (rlscope methods NAME for one in full; names are "
             "case-insensitive)", ""]
    for name, spec in METHODS.items():
        lines += [f"{name:<{width}}{summary(spec)}", f"{'':<{width}}{spec.description}"]
    return "\n".join(lines) + "\n"


def _doc(fn: Callable[..., object]) -> str:
    """The first paragraph of a component's docstring, on one line."""
    paragraph = (fn.__doc__ or "").strip().split("\n\n")[0]
    return " ".join(line.strip() for line in paragraph.splitlines())


def _settings(config: object, settings: tuple[tuple[str, str], ...]) -> str:
    return ", ".join(f"{field} {getattr(config, field)!s}"
                     + (f" (--{flag})" if flag else "") for field, flag in settings)


def describe(name: str) -> str:
    """``rlscope methods NAME``: one preset in full (``name`` may be an alias)."""
    name = canonical_method_name(name)
    spec = METHODS[name]
    rows: list[tuple[str, str, str]] = []   # (axis, value and settings, docstring)
    if spec.objective.name in OWN_CREDIT:
        rows.append(("advantage", f"{spec.advantage.name} (logged only: the objective computes "
                     "its own credit from the rewards or labels)", ""))
    else:
        rows.append(("advantage", f"{spec.advantage.name} (--advantage); " + _settings(
            spec.advantage, ADVANTAGE_SETTINGS.get(spec.advantage.name, _ADV_COMMON)),
            _doc(ADVANTAGES[spec.advantage.name])))
    rows.append(("gate", f"{spec.gate.name} (--gate)" + (
        f"; {s}" if (s := _settings(spec.gate, GATE_SETTINGS.get(spec.gate.name, ()))) else ""),
        _doc(GATES[spec.gate.name])))
    rows.append(("objective", f"{spec.objective.name} (--objective)" + (
        f"; {s}" if (s := _settings(spec.objective, OBJECTIVE_SETTINGS.get(
            spec.objective.name, ()))) else ""), _doc(OBJECTIVES[spec.objective.name])))
    rows.append(("aggregation", f"{spec.agg} (--agg)", ""))
    rows.append(("KL", ("off (--kl_coef > 0 turns it on)" if spec.kl.coef <= 0
                        else _settings(spec.kl, KL_SETTINGS + CONTROL_KL_SETTINGS.get(
                            spec.kl.control, ()))), ""))
    rows.append(("entropy bonus", f"coef {spec.entropy_coef:g} (--entropy_coef), "
                 + _settings(spec.entropy, ENTROPY_SETTINGS if spec.entropy.control ==
                             "adaptive" else ENTROPY_SETTINGS[:1]), ""))
    if spec.needs_value:
        rows.append(("critic", f"value head, vf_coef {spec.value.coef:g} (--vf_coef), "
                     f"value_clip {spec.value.clip:g} (--value_clip)", ""))
    rows.append(("selection", f"{spec.selection} (--selection)" + (
        f"; keep_ratio {spec.keep_ratio:g} (--keep_ratio)" if spec.selection == "kondo"
        else ""), ""))
    overlong = spec.overlong
    rows.append(("overlong", f"{overlong.name} (--overlong)" + (
        f"; buffer {overlong.buffer or 'max(1, L_max // 4)'} (--overlong_buffer), factor "
        f"{overlong.factor:g} (--overlong_factor), active only when completions can stop "
        "early" if overlong.name != "none" else ""), ""))
    correction = spec.correction
    rows.append(("correction", f"{correction.name} (--is_correction)" + (
        f"; {_settings(correction, CORRECTION_SETTINGS)}" if correction.name != "none"
        else ""), _doc(CORRECTIONS[correction.name])))
    width = max(len(axis) for axis, _, _ in rows) + 2
    lines = [f"{name}: {spec.description}", "",
             f"{'source':<{width}}{spec.source}",
             f"{'valid regime':<{width}}{spec.regime}",
             f"{'run needs':<{width}}{needs(spec)}", ""]
    for axis, value, doc in rows:
        lines.append(f"{axis:<{width}}{value}")
        if doc:
            lines.append(f"{'':<{width}}  {doc}")
    return "\n".join(lines) + "\n"


def render_markdown() -> str:
    lines = [
        "# Update-rule presets",
        "",
        "Generated from the registry `rlscope.methods.METHODS` by "
        "`python -m rlscope.methods.catalog > docs/methods.md`; do not edit by hand. "
        "`rlscope methods NAME` prints one preset in full. Names are case-insensitive and "
        "CamelCase aliases work (`DrGRPO`, `FreshDG`). Every component can be overridden on "
        "the command line (`--advantage`, `--gate`, `--objective`, `--agg`, `--selection`, "
        "`--kl_coef`, ...).",
        "",
        "| preset | advantage | gate | objective | agg | KL | selection | needs | what it is | "
        "source | valid regime |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, spec in METHODS.items():
        lines.append(
            f"| `{name}` | {spec.advantage.name} | {spec.gate.name} | "
            f"{objective_summary(spec)} | {spec.agg} | {kl_summary(spec)} | "
            f"{selection_summary(spec)} | {needs(spec)} | {spec.description} | {spec.source} | "
            f"{spec.regime} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render_markdown())
