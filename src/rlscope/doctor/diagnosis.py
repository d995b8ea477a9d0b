"""One run's diagnosis: findings, unavailable checks and the summary tables.

The summary has three parts (issue 5): a per-metric trend table (first window, last window,
change, whether it exceeds step-to-step noise, up/down steps), a phase-time breakdown where the
log has timings, and a validation table (first, last and best of each validation metric over
evaluations, which covers verl's ``mean@k``/``best@k``/``pass@k`` keys and our
``eval/test_error``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlscope.doctor.findings import DoctorConfig, Finding, Unavailable
from rlscope.doctor.importers import load
from rlscope.doctor.rules import LOWER_IS_BETTER, diagnose, validation_metrics
from rlscope.doctor.stats import Trend, trend
from rlscope.doctor.table import MetricTable
from rlscope.doctor.translate import is_seconds

KEY_METRICS = ("reward/mean", "policy/entropy", "policy/entropy_sampled", "length/mean",
               "adv/amplification", "policy/kl_ref_k1", "policy/kl_behaviour_k1",
               "policy/clipfrac_region", "optim/grad_norm", "loss/value", "value/explained_var",
               "time/step")
TIME_PREFIXES = ("time/", "timing_s/", "timing/")
TOTAL_TIME = ("time/step", "timing_s/step")
RANK_MEAN = "_mean"
"""A data-parallel run's ``time/<phase>_mean`` (the mean over ranks; ``time/<phase>`` is the
slowest rank's): no phase of its own, the rank_imbalance rule reads it."""


@dataclass
class Diagnosis:
    table: MetricTable
    findings: list[Finding]
    unavailable: dict[str, Unavailable]
    trends: dict[str, Trend] = field(default_factory=dict)
    phases: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Phase → (mean seconds per step, share of the step)."""
    validation: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def verdict(self) -> Finding | None:
        return next((f for f in self.findings if f.id == "learning_verdict"), None)

    def as_dict(self) -> dict[str, Any]:
        t = self.table
        return {
            "source": t.source, "format": t.fmt, "points": t.n_points,
            "steps": list(t.steps) if t.steps else None,
            "findings": [f.as_dict() for f in self.findings],
            "unavailable": {k: list(v.needs) for k, v in self.unavailable.items()},
            "unavailable_reasons": {k: {"reason": v.reason, "text": str(v)}
                                    for k, v in self.unavailable.items()},
            "trends": {k: v.as_dict() for k, v in self.trends.items()},
            "phases": {k: {"mean_s": m, "share": s} for k, (m, s) in self.phases.items()},
            "validation": self.validation,
            "translations": {k: {"from": v, "note": t.notes.get(k, "")}
                             for k, v in t.original.items()},
            "problems": [str(p) for p in t.problems],
            "n_problems": t.n_problems,
            "import_notes": list(t.import_notes),
            "skipped_non_finite": t.n_skipped_values,
        }


def trend_table(t: MetricTable, names: list[str] | None = None) -> dict[str, Trend]:
    """Trends of ``names`` (default: the key metrics present, then every other metric with at
    least 3 points, excluding validation and timing metrics)."""
    if names is None:
        vals = set(validation_metrics(t))
        names = [n for n in KEY_METRICS if t.has(n, 3)]
        names += [n for n in t.names() if n not in names and n not in vals and t.has(n, 3)
                  and not n.startswith(TIME_PREFIXES)]
    return {n: trend(*t.series(n)) for n in names if t.has(n, 1)}


def phase_table(t: MetricTable) -> dict[str, tuple[float, float]]:
    """Phase → (mean seconds each time it ran, its total time / the steps' total time). A
    phase outside the step (evaluation) can exceed 100%."""
    total_name = t.first(*TOTAL_TIME)
    phases = [n for n in t.names() if n.startswith(TIME_PREFIXES) and n != total_name
              and is_seconds(n)  # a token count or a count under timing_s/ is no phase
              and not n.endswith(RANK_MEAN)]
    if not phases:
        return {}
    total = float(t.values(total_name).sum()) if total_name else sum(
        float(t.values(n).sum()) for n in phases)
    out = {n: (float(t.values(n).mean()), float(t.values(n).sum()) / max(total, 1e-12))
           for n in phases}
    if total_name:
        out[total_name] = (float(t.values(total_name).mean()), 1.0)
    return out


def validation_table(t: MetricTable) -> dict[str, dict[str, float]]:
    out = {}
    for name in validation_metrics(t):
        steps, v = t.series(name)
        lower = any(k in name for k in LOWER_IS_BETTER)
        out[name] = {"evaluations": float(len(v)), "first": float(v[0]), "last": float(v[-1]),
                     "best": float(v.min() if lower else v.max()),
                     "best_step": float(steps[int(np.argmin(v) if lower else np.argmax(v))])}
    return out


def diagnose_table(t: MetricTable, cfg: DoctorConfig | None = None) -> Diagnosis:
    findings, unavailable = diagnose(t, cfg)
    return Diagnosis(table=t, findings=findings, unavailable=unavailable, trends=trend_table(t),
                     phases=phase_table(t), validation=validation_table(t))


def run_doctor(path: str | Path, fmt: str = "auto", cfg: DoctorConfig | None = None
               ) -> list[Diagnosis]:
    """Import ``path`` and diagnose every run in it."""
    return [diagnose_table(t, cfg) for t in load(path, fmt).tables]
