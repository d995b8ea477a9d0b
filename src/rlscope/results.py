"""Results of runs as numbers: tidy rows, their readers, and the statistics across runs.

One module (numpy and the standard library only: no torch, no matplotlib, nothing else of
rlscope, so any layer may import it) for everything that reads finished or running
runs back: `rlscope.sweep.aggregate` (tables and files beside a sweep), `rlscope.report`
(figures and the HTML report) and the doctor's importers (`number`).

- `TidyRow`: one value of one metric at one step of one run, the long form ``results.csv``
  holds (columns `RESULTS_COLUMNS`; ``name`` is the run id without the seed, the unit runs are
  aggregated over).
- Readers: `iter_jsonl` (the tolerant JSONL reader), `read_run_dir` (a run directory's
  ``metrics.jsonl`` and ``eval.jsonl``) and `read_results_csv` (a sweep's ``results.csv``)
  give the same rows, so a run and a sweep go through one code path. `number` / `finite`
  coerce logged values.
- Statistics: `mean_sd`, `sem`; `index` groups rows into one `Series` per metric and name;
  `curve` / `curves` (mean ± SEM per step) and `final_values` (each run's last value, then
  mean ± sd across runs) read it.

Conventions (stated once, used by the sweep's tables, the figures and the report):

- values are used as logged: ``nan`` and ``±inf`` (which the JSONL files hold as strings) are
  kept, so a diverged seed makes its name's mean ``nan`` at that step and in the final table
  instead of silently dropping out; booleans count as 0/1; anything else that is not a number
  is skipped, and so is a record without a finite ``step``;
- when a run logged the same (metric, step) twice (a resumed leg re-evaluates the step it
  resumed at), the last value counts;
- sd is the sample standard deviation across runs (ddof = 1), NaN for one run; the standard
  error of the mean is ``SEM = sd / √n``, NaN with one run at a step (no band);
- the final value of a run is its value at the last step at which it logged the metric.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np

Kind = Literal["train", "eval"]

RESULTS_CSV = "results.csv"
RESULTS_COLUMNS = ("run", "name", "method", "seed", "kind", "step", "metric", "value")
"""The columns of ``results.csv``, the fields of `TidyRow`."""
RUN_FILES: tuple[tuple[Kind, str], ...] = (("train", "metrics.jsonl"), ("eval", "eval.jsonl"))
"""The files of a run directory that hold rows, and the kind of their rows."""


class ResultsError(ValueError):
    """An input that cannot be read as results, with a message that says what was expected."""


@dataclass(frozen=True)
class TidyRow:
    """One logged value of one run."""

    run: str
    """The run directory's name, ``<name>_s<seed>``."""
    name: str
    """The run's id without the seed: what seeds are aggregated over."""
    method: str
    """The update-rule preset the run trained with."""
    seed: int
    """The run's seed."""
    kind: Kind
    """``train`` (a metrics.jsonl record, one per optimizer step) or ``eval`` (eval.jsonl)."""
    step: int
    """The optimizer step the value belongs to (evaluations run before that step's update)."""
    metric: str
    """The canonical metric name (``eval/test_error``, ``policy/entropy``, ...)."""
    value: float
    """The logged value (nan and ±inf are kept)."""


# ------------------------------------------------------------------------------- numbers


def number(value: Any) -> float | None:
    """A logged value as a float: numbers and booleans, and the strings of numbers (CSV cells,
    and ``"nan"`` / ``"inf"`` / ``"-inf"``, which is how the JSONL files write non-finite
    floats); None for anything else."""
    if isinstance(value, bool | int | float):
        try:
            return float(value)
        except OverflowError:  # an integer beyond the float range, as a JSON 1e400 reads
            return math.inf if value > 0 else -math.inf
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


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof = 1); sd is nan for fewer than two values and
    both are nan for none."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    # fsum is exact for finite values but raises on inf + -inf (two seeds diverging in opposite
    # directions); plain summation gives nan there, as it should.
    total = math.fsum if all(math.isfinite(v) for v in values) else sum
    mean = total(values) / n
    if n == 1:
        return mean, math.nan
    return mean, math.sqrt(total((v - mean) ** 2 for v in values) / (n - 1))


def sem(values: Sequence[float] | np.ndarray) -> float:
    """Standard error of the mean, sample sd / √n (nan for fewer than two values)."""
    floats = [float(v) for v in values]
    return mean_sd(floats)[1] / math.sqrt(len(floats)) if len(floats) > 1 else math.nan


# ------------------------------------------------------------------------------- readers


def iter_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """The JSON objects of a JSONL file, for readers of finished or killed runs: blank,
    malformed and non-object lines are skipped (a run killed mid-write leaves a partial last
    line), and a missing file yields nothing."""
    if not path.exists():
        return
    with path.open(encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                yield obj



def read_run_dir(run_dir: Path, run: str, name: str, method: str, seed: int,
                 metrics: Collection[str] | None = None) -> list[TidyRow]:
    """A run directory's ``metrics.jsonl`` (kind train) and ``eval.jsonl`` (kind eval) as tidy
    rows, train before eval, in logged order; only ``metrics`` when given."""
    rows = []
    for kind, file in RUN_FILES:
        for record in iter_jsonl(run_dir / file):
            step = finite(record.get("step"))
            if step is None:
                continue
            for metric, raw in record.items():
                if metric == "step" or (metrics is not None and metric not in metrics):
                    continue
                value = number(raw)
                if value is not None:
                    rows.append(TidyRow(run, name, method, seed, kind, int(step), metric,
                                        value))
    return rows


def rows_from_records(records: Iterable[dict[str, Any]],
                      metrics: Collection[str] | None = None) -> list[TidyRow]:
    """Tidy rows from ``results.csv``-shaped records (a CSV's or a Parquet table's), only
    ``metrics`` when given; a record whose value or step is not a number is skipped."""
    rows = []
    for r in records:
        if metrics is not None and r["metric"] not in metrics:
            continue
        value, step, seed = number(r["value"]), finite(r["step"]), finite(r["seed"])
        if value is None or step is None:
            continue
        rows.append(TidyRow(run=str(r["run"]), name=str(r["name"]), method=str(r["method"]),
                            seed=int(seed) if seed is not None else 0,
                            kind=cast(Kind, r["kind"]), step=int(step),
                            metric=str(r["metric"]), value=value))
    return rows


def read_results_csv(path: Path, metrics: Collection[str] | None = None) -> list[TidyRow]:
    """The tidy rows of a sweep's ``results.csv``, only ``metrics`` when given (a sweep's file
    holds every metric of every step; a figure needs a few)."""
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in RESULTS_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ResultsError(f"{path}: missing column(s) {', '.join(missing)}; a sweep's "
                               f"results.csv has {','.join(RESULTS_COLUMNS)}")
        return rows_from_records(reader, metrics)


# --------------------------------------------------------------------- across runs


@dataclass
class Series:
    """One name's values of one metric: ``run -> step -> value``, with each run's seed."""

    method: str
    kind: Kind
    """The kind of the first row seen."""
    by_run: dict[str, dict[int, float]] = field(default_factory=dict)
    seeds: dict[str, int] = field(default_factory=dict)

    def last_values(self) -> list[tuple[str, int, float]]:
        """``(run, step, value)`` at each run's last logged step, runs ordered by seed."""
        runs = sorted(self.by_run, key=lambda run: self.seeds[run])
        return [(run, step, self.by_run[run][step])
                for run in runs for step in [max(self.by_run[run])]]


def index(rows: Iterable[TidyRow]) -> dict[str, dict[str, Series]]:
    """``metric -> name -> series`` in one pass, names in first-seen order; a repeated
    (run, step) keeps the last value."""
    out: dict[str, dict[str, Series]] = {}
    for r in rows:
        series = out.setdefault(r.metric, {}).get(r.name)
        if series is None:
            series = out[r.metric][r.name] = Series(r.method, r.kind)
        series.by_run.setdefault(r.run, {})[r.step] = r.value
        series.seeds[r.run] = r.seed
    return out


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
    sd_S: np.ndarray | None = None
    """Sample standard deviation across runs (ddof = 1; NaN where fewer than two runs
    logged); None where not computed."""

    @property
    def n_runs(self) -> int:
        return int(self.n_S.max()) if len(self.n_S) else 0


def curve(name: str, series: Series) -> Curve:
    """At each step, the mean over the runs that logged it, its standard error and the sample
    standard deviation."""
    steps = sorted({s for values in series.by_run.values() for s in values})
    mean, sd, err, n = [], [], [], []
    for step in steps:
        values = [v[step] for v in series.by_run.values() if step in v]
        m, d = mean_sd(values)
        mean.append(m)
        sd.append(d)
        err.append(sem(values))
        n.append(len(values))
    return Curve(name=name, steps_S=np.array(steps, dtype=np.int64), mean_S=np.array(mean),
                 sem_S=np.array(err), n_S=np.array(n, dtype=np.int64), sd_S=np.array(sd))


def curves(rows: Iterable[TidyRow], metric: str) -> dict[str, Curve]:
    """Per name (sorted), the mean ± SEM across its runs of ``metric`` at every step."""
    return {name: curve(name, series)
            for name, series in sorted(index(rows).get(metric, {}).items())}


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


def final_value(series: Series) -> FinalValue:
    """Mean ± sd across runs of each run's last logged value."""
    last = [value for _, _, value in series.last_values()]
    mean, sd = mean_sd(last)
    return FinalValue(mean=mean, sd=sd, n=len(last))


def final_values(rows: Iterable[TidyRow], metrics: Iterable[str]
                 ) -> dict[str, dict[str, FinalValue]]:
    """name → metric → final value across the name's runs (names sorted; a metric a name
    never logged is absent from its dict)."""
    indexed = index(rows)
    out: dict[str, dict[str, FinalValue]] = {}
    for metric in metrics:
        for name, series in indexed.get(metric, {}).items():
            out.setdefault(name, {})[metric] = final_value(series)
    return dict(sorted(out.items()))
