"""The report's view of results: tidy rows, mean ± SEM curves and final values per name.

A *tidy row* is one value of one metric at one step of one run, the long form that
``rlscope sweep`` writes to ``results.csv`` (columns ``run,name,method,seed,kind,step,metric,
value``; ``name`` is the run id without the seed). A single run directory is read into the
same rows, so a run and a sweep go through one code path.

This module is deliberately small and self-contained (numpy only): it is the seam where
``rlscope.sweep.aggregate`` (``load_tidy``, ``curves``, ``final_table``) can replace it, as
long as the replacement returns the same `Curve` and `FinalValue` records.

Conventions (stated once, used by the figures and the tables):

- values are used as logged, as ``rlscope.sweep.aggregate`` does: ``nan`` and ``±inf`` (which
  the JSONL files hold as strings) are kept, so a diverged seed makes its name's mean ``nan``
  at that step (a gap in the line) and in the final table, instead of silently dropping out;
  booleans count as 0/1; anything else that is not a number is skipped;
- curves: at each step, the mean over the runs of a name that logged the metric at that step,
  and the standard error of that mean, ``SEM = s / √n`` with the sample standard deviation
  ``s`` (ddof = 1); with one run at a step the SEM is not estimable and is NaN (no band);
- final value of a run: the value at the last step at which that run logged the metric;
  across the runs of a name, ``mean ± sample sd (n)``, sd NaN for one run.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlscope.metrics.sinks import iter_jsonl
from rlscope.sweep import aggregate

RESULTS_COLUMNS = ("run", "name", "method", "seed", "kind", "step", "metric", "value")


class ReportError(ValueError):
    """An input the report cannot use, with a message that says what was expected."""


@dataclass(frozen=True)
class TidyRow:
    """One logged value of one metric at one step of one run."""

    run: str
    name: str
    method: str
    seed: int
    kind: str
    """``train`` (metrics.jsonl) or ``eval`` (eval.jsonl)."""
    step: float
    metric: str
    value: float


@dataclass(frozen=True)
class Curve:
    """One name's trajectory of one metric: shapes ``[S]`` over the steps ``S`` any run of the
    name logged it at, in increasing order."""

    name: str
    steps_S: np.ndarray
    mean_S: np.ndarray
    sem_S: np.ndarray
    """Standard error of the mean across runs; NaN where fewer than two runs logged."""
    n_S: np.ndarray
    """How many runs contributed at each step."""

    @property
    def n_runs(self) -> int:
        return int(self.n_S.max()) if len(self.n_S) else 0


@dataclass(frozen=True)
class FinalValue:
    """A name's final value of one metric across its runs: ``mean ± sd (n)``."""

    mean: float
    sd: float
    """Sample standard deviation (ddof = 1); NaN for a single run."""
    n: int

    def text(self) -> str:
        sd = "" if math.isnan(self.sd) else f" ± {self.sd:.4g}"
        return f"{self.mean:.4g}{sd} ({self.n})"


def number(value: Any) -> float | None:
    """A logged value as a float: numbers and booleans, and the strings of numbers (CSV cells,
    and ``"nan"`` / ``"inf"`` / ``"-inf"``, which is how the JSONL files write non-finite
    floats); None for anything else."""
    if isinstance(value, bool | int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def finite(value: Any) -> float | None:
    """`number`, and only when finite (steps, seeds, wall times)."""
    x = number(value)
    return x if x is not None and math.isfinite(x) else None


def read_results_csv(path: Path, metrics: Collection[str] | None = None) -> list[TidyRow]:
    """The tidy rows of a sweep's ``results.csv``, only ``metrics`` when given (a sweep's file
    holds every metric of every step; the report needs a few)."""
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in RESULTS_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ReportError(f"{path}: missing column(s) {', '.join(missing)}; a sweep's "
                              f"results.csv has {','.join(RESULTS_COLUMNS)}")
        rows = []
        for r in reader:
            if metrics is not None and r["metric"] not in metrics:
                continue
            value, step, seed = number(r["value"]), finite(r["step"]), finite(r["seed"])
            if value is None or step is None:
                continue
            rows.append(TidyRow(run=r["run"], name=r["name"], method=r["method"],
                                seed=int(seed) if seed is not None else 0, kind=r["kind"],
                                step=step, metric=r["metric"], value=value))
    return rows


def rows_from_run_dir(run_dir: Path, run: str, name: str, method: str, seed: int,
                      metrics: Collection[str] | None = None) -> list[TidyRow]:
    """A run directory's ``metrics.jsonl`` (kind train) and ``eval.jsonl`` (kind eval) as
    tidy rows; objects without a numeric ``step`` are skipped."""
    rows = []
    for kind, file in (("train", "metrics.jsonl"), ("eval", "eval.jsonl")):
        for obj in iter_jsonl(run_dir / file):
            step = finite(obj.get("step"))
            if step is None:
                continue
            for metric, raw in obj.items():
                if metric == "step" or (metrics is not None and metric not in metrics):
                    continue
                value = number(raw)
                if value is not None:
                    rows.append(TidyRow(run=run, name=name, method=method, seed=seed,
                                        kind=kind, step=step, metric=metric, value=value))
    return rows


def _per_run(rows: Iterable[TidyRow], metric: str) -> dict[str, dict[str, dict[float, float]]]:
    """name → run → step → value of ``metric`` (a repeated step keeps its last value)."""
    out: dict[str, dict[str, dict[float, float]]] = defaultdict(lambda: defaultdict(dict))
    for r in rows:
        if r.metric == metric:
            out[r.name][r.run][r.step] = r.value
    return out


def sem(values: np.ndarray) -> float:
    """Standard error of the mean, ``s / √n`` with ddof = 1; NaN for fewer than two values
    (`rlscope.sweep.aggregate.sem`, so the report and the sweep's tables agree)."""
    return aggregate.sem([float(v) for v in values])


def curves(rows: Iterable[TidyRow], metric: str) -> dict[str, Curve]:
    """Per name (sorted), the mean ± SEM across its runs of ``metric`` at every step."""
    out = {}
    for name, runs in sorted(_per_run(rows, metric).items()):
        steps = sorted({s for series in runs.values() for s in series})
        mean, err, n = [], [], []
        for s in steps:
            vals = np.array([series[s] for series in runs.values() if s in series])
            with np.errstate(invalid="ignore"):  # inf − inf: nan, quietly
                mean.append(float(vals.mean()))
            err.append(sem(vals))
            n.append(len(vals))
        out[name] = Curve(name=name, steps_S=np.array(steps), mean_S=np.array(mean),
                          sem_S=np.array(err), n_S=np.array(n, dtype=np.int64))
    return out


def final_values(rows: Iterable[TidyRow], metrics: Iterable[str]
                 ) -> dict[str, dict[str, FinalValue]]:
    """name → metric → final value across the name's runs (names sorted; a metric a name
    never logged is absent from its dict)."""
    rows = list(rows)
    out: dict[str, dict[str, FinalValue]] = defaultdict(dict)
    for metric in metrics:
        for name, runs in _per_run(rows, metric).items():
            last = [series[max(series)] for series in runs.values()]
            mean, sd = aggregate.mean_sd(last)
            out[name][metric] = FinalValue(mean=mean, sd=sd, n=len(last))
    return dict(sorted(out.items()))
