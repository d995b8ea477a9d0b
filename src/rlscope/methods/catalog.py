"""The preset registry rendered for people: ``rlscope methods [NAME]`` and ``docs/methods.md``.

    python -m rlscope.methods.catalog > docs/methods.md     (kept in sync by a test)

`summary` is a preset's components on one line, `describe` a preset in full: every component
with the first paragraph of its docstring, the settings that component reads with their
values and the flag that overrides each, the source, the valid regime and what a run needs.
"""

from __future__ import annotations

import sys
from typing import Any

from rlscope.methods.component import Component
from rlscope.methods.corrections import CORRECTION_METRICS, CORRECTIONS, CorrectionConfig
from rlscope.methods.presets import METHODS, canonical_method_name
from rlscope.methods.resolve import flag_of
from rlscope.methods.spec import MethodSpec

KL_SETTINGS = ("coef", "estimator", "target", "place", "control")
"""The KL regulariser's settings shown whenever it is on, then those of its control mode."""
CONTROL_KL_SETTINGS = {"adaptive": ("target_value", "horizon"), "warmup": ("warmup_steps",)}
ENTROPY_SETTINGS = ("control", "target", "delta", "window")


def kl_summary(spec: MethodSpec) -> str:
    k = spec.kl
    if k.coef <= 0:
        return "—"
    return f"{k.estimator} to {k.target} in the {k.place}, β={k.coef:g} ({k.control})"


def objective_summary(spec: MethodSpec) -> str:
    o, reads = spec.objective, spec.objective_component.settings
    if "dppo_delta_low" in reads:
        return f"{o.name} δ {o.dppo_delta_low:g}/{o.dppo_delta_high:g}"
    if "kl_cov_ratio" in reads:
        return f"{o.name} k_r {o.kl_cov_ratio:g} β {o.kl_cov_coef:g}"
    if "clip_low" in reads:
        return f"{o.name} ε {o.clip_low:g}/{o.clip_high:g}"
    if "cap" in reads:
        return f"{o.name} (cap {o.cap:g})"
    return o.name


def needs(spec: MethodSpec) -> str:
    """What a run must provide, comma-separated ("—" when nothing)."""
    return ", ".join(spec.requires + (("groups",) if spec.grouped else ())
                     + (("critic",) if spec.needs_value else ())
                     + (("sampler log-probs",) if spec.corrected else ())
                     + (("sampler log-probs",) if spec.gate_component.sampler_mismatch else ())
                     + ((("teacher logits" if spec.needs_teacher_distribution
                          else "teacher log-probs"),) if spec.needs_teacher else ())) or "—"


def correction_summary(spec: MethodSpec) -> str:
    """The correction with the settings its component reads (``none`` when off)."""
    c, reads = spec.correction, spec.correction_component.settings
    parts = [c.name]
    if "cap" in reads:
        parts.append(f"C {c.cap:g}" if c.cap_low <= 0 else f"[{c.cap_low:g}, {c.cap:g}]")
    if "band_low" in reads:
        parts.append(f"band [{c.band_low:g}, {c.band_high:g}]")
    if "keep_ratio" in reads and c.keep_ratio:
        parts.append("× ρ")
    if "geometric" in reads and c.geometric:
        parts.append("geometric")
    return " ".join(parts)


def selection_summary(spec: MethodSpec) -> str:
    parts = [spec.selection]
    if "keep_ratio" in spec.selection_component.settings:
        parts[0] = f"{spec.selection} (keep {spec.keep_ratio:g})"
    if not spec.overlong_component.identity:
        parts.append(f"overlong {spec.overlong.name}")
    return " + ".join(parts)


def summary(spec: MethodSpec) -> str:
    """The preset's components on one line: advantage · gate · objective · agg · KL · selection
    · correction (a gate of none, no KL, no selection and no correction are left out)."""
    parts = [spec.advantage.name]
    if spec.gate.name != "none":
        parts.append(spec.gate.name)
    parts += [objective_summary(spec), spec.agg]
    if spec.kl.coef > 0:
        parts.append(f"KL {spec.kl.estimator}→{spec.kl.target} β {spec.kl.coef:g}")
    if not (spec.selection_component.identity and spec.overlong_component.identity):
        parts.append(selection_summary(spec))
    if spec.corrected:
        parts.append(correction_summary(spec))
    return " · ".join(parts)


def render_list() -> str:
    """``rlscope methods``: every preset, its components on one line, its description below."""
    width = max(map(len, METHODS)) + 2
    lines = ["update-rule presets (rlscope methods NAME for one in full; names are "
             "case-insensitive)", ""]
    for name, spec in METHODS.items():
        lines += [f"{name:<{width}}{summary(spec)}", f"{'':<{width}}{spec.description}"]
    return "\n".join(lines) + "\n"


def _doc(component: Component[Any, Any]) -> str:
    """The first paragraph of a component's docstring, on one line."""
    paragraph = (component.fn.__doc__ or "").strip().split("\n\n")[0]
    return " ".join(line.strip() for line in paragraph.splitlines())


def _settings(config: object, axis: str, settings: tuple[str, ...]) -> str:
    """``field value (--flag)`` for each setting the component reads, comma-separated."""
    out = []
    for field in settings:
        flag = flag_of(f"{axis}.{field}" if axis else field)
        out.append(f"{field} {getattr(config, field)!s}" + (f" (--{flag})" if flag else ""))
    return ", ".join(out)


def _named(axis: str, name: str, config: object, component: Component[Any, Any]) -> str:
    """``name (--flag); settings``, the settings left out when the component reads none."""
    head = f"{name} (--{flag_of(f'{axis}.name' if axis else 'selection')})"
    settings = _settings(config, axis, component.settings)
    return f"{head}; {settings}" if settings else head


def describe(name: str) -> str:
    """``rlscope methods NAME``: one preset in full (``name`` may be an alias)."""
    name = canonical_method_name(name)
    spec = METHODS[name]
    rows: list[tuple[str, str, str]] = []   # (axis, value and settings, docstring)
    if spec.objective_component.own_credit:
        rows.append(("advantage", f"{spec.advantage.name} (logged only: the objective computes "
                     "its own credit from the rewards or labels)", ""))
    else:
        rows.append(("advantage", _named("advantage", spec.advantage.name, spec.advantage,
                                         spec.advantage_component),
                     _doc(spec.advantage_component)))
    rows.append(("gate", _named("gate", spec.gate.name, spec.gate, spec.gate_component),
                 _doc(spec.gate_component)))
    rows.append(("objective", _named("objective", spec.objective.name, spec.objective,
                                     spec.objective_component), _doc(spec.objective_component)))
    rows.append(("aggregation", f"{spec.agg} (--{flag_of('agg')})", ""))
    rows.append(("KL", ("off (--kl_coef > 0 turns it on)" if spec.kl.coef <= 0
                        else _settings(spec.kl, "kl", KL_SETTINGS + CONTROL_KL_SETTINGS.get(
                            spec.kl.control, ()))), ""))
    rows.append(("entropy bonus", f"coef {spec.entropy_coef:g} (--{flag_of('entropy_coef')}), "
                 + _settings(spec.entropy, "entropy", ENTROPY_SETTINGS
                             if spec.entropy.control == "adaptive" else ENTROPY_SETTINGS[:1]),
                 ""))
    if spec.needs_value:
        rows.append(("critic", f"value head, vf_coef {spec.value.coef:g} (--vf_coef), "
                     f"value_clip {spec.value.clip:g} (--value_clip)"
                     + (f", pre-trained {spec.value.pretrain_steps} steps "
                        "(--critic_pretrain_steps)" if spec.value.pretrain_steps else ""), ""))
    if spec.pos_nll_coef > 0:
        rows.append(("aux loss", f"pos_nll μ {spec.pos_nll_coef:g} (--pos_nll_coef): NLL of "
                     "the successful rows (r ≥ 1)", ""))
    if spec.fp32_head:
        rows.append(("policy", "fp32_head (--fp32_head): LM head matmul and log-softmax in "
                     "float32 under --autocast", ""))
    rows.append(("selection", _named("", spec.selection, spec, spec.selection_component), ""))
    overlong = spec.overlong
    rows.append(("overlong", f"{overlong.name} (--overlong)" + (
        f"; buffer {overlong.buffer or 'max(1, L_max // 4)'} (--overlong_buffer), factor "
        f"{overlong.factor:g} (--overlong_factor), active only when completions can stop "
        "early" if spec.overlong_component.settings else ""), ""))
    rows.append(("correction", _named("correction", spec.correction.name, spec.correction,
                                      spec.correction_component),
                 _doc(spec.correction_component)))
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
        "| preset | advantage | gate | objective | agg | KL | selection | correction | needs | "
        "what it is | source | valid regime |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, spec in METHODS.items():
        lines.append(
            f"| `{name}` | {spec.advantage.name} | {spec.gate.name} | "
            f"{objective_summary(spec)} | {spec.agg} | {kl_summary(spec)} | "
            f"{selection_summary(spec)} | {correction_summary(spec)} | {needs(spec)} | "
            f"{spec.description} | {spec.source} | {spec.regime} |")
    return "\n".join([*lines, "", *corrections_markdown()]) + "\n"


def corrections_markdown() -> list[str]:
    """The ``Sampler–learner corrections`` section of ``docs/methods.md``: every correction
    with its weight and the settings it reads (their defaults and flags), then its metrics."""
    default = CorrectionConfig()
    lines = [
        "## Sampler–learner corrections",
        "",
        "A sampler distinct from the learner (an inference engine, low-precision weights, "
        "staleness, a top-k/top-p set not replayed) gives log-probs ℓ_s that differ from the "
        "learner's ℓ_o, computed once per step before the update. A correction multiplies each "
        "token's loss by a detached weight w of ρ_c = exp(ℓ_o − ℓ_s) (token) or of the "
        "sequence ratio exp Σ_t (ℓ_o − ℓ_s) (product; `--is_geometric True`: geometric mean). "
        f"`--{flag_of('correction.name')} NAME` adds one to any preset; when ℓ_s = ℓ_o every "
        "weight is exactly 1 and the run is the preset without it (a run where the learner "
        "samples, with no --delay, replay buffer or --overfit_batch and the top-k/top-p set "
        "replayed, warns that the correction does nothing).",
        "",
        "| correction | weight | settings (default, flag) |",
        "| --- | --- | --- |",
    ]
    for name, component in CORRECTIONS.items():
        weight = _doc(component).replace("|", "\\|")  # |y| inside a table cell
        lines.append(f"| `{name}` | {weight} | "
                     f"{_settings(default, 'correction', component.settings) or '—'} |")
    lines += [
        "",
        "Presets with a correction (\"× ρ\": `--is_keep_ratio True`): "
        + "; ".join(f"`{name}`: {correction_summary(spec)}" for name, spec in METHODS.items()
                    if spec.corrected) + ". "
        "Example, ρ_c = (0.4, 1, 2.5, 6): token_truncate C 2 (TIS) w = (0.4, 1, 2, 2); "
        "token_mask band [0.5, 5] × ρ (IcePop) (0, 1, 2.5, 0); token_mask band [0.5, 5] "
        "(0, 1, 1, 0). Rows with token ratios (1.5, 1.5) and (2, 2): sequence_mask band [0, 3] "
        "× ρ w = 2.25 and 0.",
        "",
        "With a correction on, the run logs (before the update; docs/metrics.md): "
        + ", ".join(f"`{m}`" for m in CORRECTION_METRICS) + ".",
    ]
    return lines


if __name__ == "__main__":
    sys.stdout.write(render_markdown())
