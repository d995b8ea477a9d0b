"""The doctor's rules (METRICS.md, "The doctor"): pure functions from a table to findings.

Each rule reads canonical metric names (importers translate foreign ones), accepts equivalent
metrics where they exist, and returns its findings, an empty list when the pattern is absent,
or `Unavailable` naming what the log lacks. Thresholds come from `DoctorConfig`. `RULES` is the
registry in the order findings are reported; `diagnose` runs them all and links causes
(``sigma_amplification`` before an ``entropy_collapse`` is its likely cause).

One module per family: `entropy`, `kl`, `reward`, `mismatch` (sampler and replay), `optim`,
`throughput`, `episodes` (multi-turn runs), `verdict` (the learning verdict and the
validation metrics it reads); `common` holds what several rules share (the rule output type,
the `_need` checks, the config facts); `combine` what runs after every rule (linked causes,
resolved conflicts, the weighed verdict, actions in the framework's settings).

Where to add a rule: a pure function ``(MetricTable, DoctorConfig) -> RuleOut`` in its
family's module (its thresholds as `DoctorConfig` fields, documented there), one entry in
`RULES` below at the place its findings should be reported, a row in docs/doctor.md, "Rules",
and its planted and quiet cases in tests/test_doctor_rules.py.
"""

from __future__ import annotations

from collections.abc import Callable

from rlscope.doctor.advice import framework_of
from rlscope.doctor.findings import DoctorConfig, Finding, Unavailable
from rlscope.doctor.rules.combine import (
    LOWER_LR,
    link_causes,
    render_actions,
    resolve_conflicts,
    weigh_verdict,
)
from rlscope.doctor.rules.common import RuleOut
from rlscope.doctor.rules.entropy import entropy_collapse, entropy_rising
from rlscope.doctor.rules.episodes import (
    env_time_dominates,
    env_tokens_in_loss,
    turn_budget_exhaustion,
)
from rlscope.doctor.rules.kl import kl_runaway, kl_too_small, negative_kl
from rlscope.doctor.rules.mismatch import sampler_mismatch, stale_replay
from rlscope.doctor.rules.optim import (
    grad_clip_saturation,
    nonfinite_gradients,
    value_instability,
)
from rlscope.doctor.rules.reward import (
    length_hacking,
    no_signal,
    oscillation,
    reward_peak_fall,
    reward_plateau,
    sigma_amplification,
    truncation,
)
from rlscope.doctor.rules.throughput import rank_imbalance, throughput_regression
from rlscope.doctor.rules.verdict import (
    EVAL_PREFIXES,
    LOWER_IS_BETTER,
    learning_verdict,
    primary_validation,
    validation_metrics,
)
from rlscope.doctor.table import MetricTable

__all__ = [
    "EVAL_PREFIXES",
    "LOWER_IS_BETTER",
    "LOWER_LR",
    "RULES",
    "RuleOut",
    "diagnose",
    "link_causes",
    "primary_validation",
    "render_actions",
    "resolve_conflicts",
    "validation_metrics",
    "weigh_verdict",
]


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
    "env_tokens_in_loss": env_tokens_in_loss,
    "turn_budget_exhaustion": turn_budget_exhaustion,
    "sampler_mismatch": sampler_mismatch,
    "nonfinite_gradients": nonfinite_gradients,
    "grad_clip_saturation": grad_clip_saturation,
    "reward_peak_fall": reward_peak_fall,
    "reward_plateau": reward_plateau,
    "oscillation": oscillation,
    "stale_replay": stale_replay,
    "throughput_regression": throughput_regression,
    "rank_imbalance": rank_imbalance,
    "env_time_dominates": env_time_dominates,
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
