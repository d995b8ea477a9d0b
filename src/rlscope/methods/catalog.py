"""The preset registry rendered for people: ``docs/methods.md`` (kept in sync by a test).

    python -m rlscope.methods.catalog > docs/methods.md
"""

from __future__ import annotations

import sys

from rlscope.methods import METHODS
from rlscope.methods.spec import MethodSpec


def kl_summary(spec: MethodSpec) -> str:
    k = spec.kl
    if k.coef <= 0:
        return "—"
    return f"{k.estimator} to {k.target} in the {k.place}, β={k.coef:g} ({k.control})"


def objective_summary(spec: MethodSpec) -> str:
    o = spec.objective
    if o.name in ("ppo_clip", "gspo", "aspo"):
        return f"{o.name} ε {o.clip_low:g}/{o.clip_high:g}"
    if o.name in ("is_capped", "traj_is_capped"):
        return f"{o.name} (cap {o.cap:g})"
    return o.name


def selection_summary(spec: MethodSpec) -> str:
    parts = [spec.selection]
    if spec.selection == "kondo":
        parts[0] = f"kondo (keep {spec.keep_ratio:g})"
    if spec.overlong.name != "none":
        parts.append(f"overlong {spec.overlong.name} (when lengths vary)")
    return " + ".join(parts)


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
        needs = ", ".join(spec.requires + (("groups",) if spec.grouped else ())
                          + (("critic",) if spec.needs_value else ())) or "—"
        lines.append(
            f"| `{name}` | {spec.advantage.name} | {spec.gate.name} | "
            f"{objective_summary(spec)} | {spec.agg} | {kl_summary(spec)} | "
            f"{selection_summary(spec)} | {needs} | {spec.description} | {spec.source} | "
            f"{spec.regime} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render_markdown())
