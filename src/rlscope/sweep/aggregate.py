"""A sweep's results as tidy rows and the statistics across seeds that tables and figures show.

No torch here: `rlscope report` and the figures import this module, and reading a finished
sweep should not wait for a model framework to load.

The API, in the order data flows through it:

- `tidy(sweep_dir) -> list[TidyRow]`: every logged value of every run, one row each
  ``(run, name, method, seed, kind, step, metric, value)``; `write_tidy` writes it as
  ``results.csv`` (and ``results.parquet`` when pyarrow is installed); `load_tidy` reads
  either back.
- `final_table(rows, metrics) -> list[FinalCell]`: per name and metric, the last logged value
  of each seed, then mean, sample sd and n across seeds.
- `crossings(rows, metric, threshold, direction) -> list[Crossing]`: the first step each seed
  crosses a threshold, then mean ± sample sd over the seeds that crossed.
- `curves(rows, metric) -> list[CurvePoint]`: per name and step, mean and standard error of the
  mean across seeds.
- `aggregate(sweep_dir, ...) -> Aggregate`: all of the above written beside the runs.

Names: ``run`` is a run directory's name (``<id>_s<seed>``), ``name`` the run's id without the
seed (one manifest entry at one grid point), the unit that seeds are aggregated over.

Statistics: sd is the sample standard deviation across seeds (ddof = 1), so it is nan for a
single seed; the standard error of the mean is sd / √n. Values are used as logged: a nan in any
seed makes that mean nan, which is what a diverged seed should look like. When a run logged the
same (metric, step) twice (a resumed leg re-evaluates the step it resumed at), the last value
counts.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal

from rlscope.metrics.sinks import iter_jsonl

Kind = Literal["train", "eval"]
Direction = Literal["<=", ">="]

RESULTS_CSV = "results.csv"
RESULTS_PARQUET = "results.parquet"
PARQUET_HINT = "pip install pyarrow to also get results.parquet"
SD_NOTE = ("sd is the sample standard deviation across seeds (ddof = 1; nan when n = 1); "
           "n is the number of seeds")
_SEED_SUFFIX = re.compile(r"_s(\d+)$")


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


@dataclass(frozen=True)
class CrossingSpec:
    """A threshold to report first-crossing steps for."""

    metric: str
    """The metric watched."""
    threshold: float
    """The level it must reach."""
    direction: Direction = "<="
    """``<=``: the first step with value ≤ threshold; ``>=``: value ≥ threshold."""


DEFAULT_CROSSINGS = (CrossingSpec("eval/entropy", 0.1, "<="),
                     CrossingSpec("eval/test_error", 0.0, "<="))
"""Entropy collapse (greedy-path entropy ≤ 0.1) and the first step at zero test error."""


@dataclass(frozen=True)
class FinalCell:
    """One name's final value of one metric across seeds."""

    name: str
    """The run id without the seed."""
    method: str
    """Its update-rule preset."""
    metric: str
    """The metric."""
    mean: float
    """Mean over seeds of each seed's last logged value."""
    sd: float
    """Sample standard deviation over seeds (ddof = 1); nan when n = 1."""
    n: int
    """Seeds with a value."""
    seeds: tuple[int, ...]
    """The seeds, in the order of ``values``."""
    values: tuple[float, ...]
    """Each seed's last value."""
    steps: tuple[int, ...]
    """The step each value was logged at (a seed that stopped early shows it here)."""


@dataclass(frozen=True)
class Crossing:
    """When one name's seeds first crossed a threshold."""

    name: str
    """The run id without the seed."""
    method: str
    """Its update-rule preset."""
    metric: str
    """The metric watched."""
    threshold: float
    """The level."""
    direction: Direction
    """``<=`` or ``>=``."""
    mean_step: float
    """Mean first-crossing step over the seeds that crossed (nan if none did)."""
    sd_step: float
    """Sample sd of those steps (ddof = 1; nan when fewer than two crossed)."""
    n_crossed: int
    """Seeds that crossed."""
    n_seeds: int
    """Seeds that logged the metric at all."""
    steps: tuple[tuple[int, int | None], ...]
    """``(seed, first step)`` per seed; None for a seed that never crossed."""


@dataclass(frozen=True)
class CurvePoint:
    """One name's metric at one step, across seeds."""

    name: str
    """The run id without the seed."""
    method: str
    """Its update-rule preset."""
    kind: Kind
    """``train`` or ``eval``."""
    metric: str
    """The metric."""
    step: int
    """The step."""
    mean: float
    """Mean over the seeds that logged this step."""
    sem: float
    """Standard error of that mean, sd / √n with the sample sd (nan when n = 1)."""
    n: int
    """Seeds that logged this step (fewer than the name's seeds where some stopped early)."""


@dataclass(frozen=True)
class Aggregate:
    """What `aggregate` computed and wrote."""

    rows: int
    """Tidy rows read."""
    final: list[FinalCell]
    """The final table."""
    crossings: list[Crossing]
    """First crossings, one list entry per (spec, name)."""
    files: list[Path]
    """Every file written."""
    parquet_note: str
    """Empty, or how to get results.parquet when pyarrow is missing."""


# ------------------------------------------------------------------------------ statistics


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


def sem(values: Sequence[float]) -> float:
    """Standard error of the mean, sample sd / √n (nan for fewer than two values)."""
    return mean_sd(values)[1] / math.sqrt(len(values)) if len(values) > 1 else math.nan


# ------------------------------------------------------------------------------- tidy rows


def _as_float(value: Any) -> float | None:
    """A logged number; JSONL writes non-finite floats as the strings nan / inf / -inf."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and value.lower() in ("nan", "inf", "-inf", "infinity",
                                                    "-infinity"):
        return float(value)
    return None


def _run_dirs(sweep_dir: Path) -> list[tuple[Path, str | None]]:
    """The run directories of a sweep with their names: those ``sweep.json`` lists (so runs
    dropped from the manifest are not reported), else every directory under ``runs/``."""
    index = sweep_dir / "sweep.json"
    if index.exists():
        runs = json.loads(index.read_text(encoding="utf-8")).get("runs", [])
        return [(sweep_dir / "runs" / r["run"], r.get("name")) for r in runs]
    runs_dir = sweep_dir / "runs"
    if not runs_dir.is_dir():
        return []
    return [(p, None) for p in sorted(runs_dir.iterdir()) if p.is_dir()]


def run_rows(run_dir: Path, name: str | None = None) -> list[TidyRow]:
    """The tidy rows of one run directory (``[]`` if it has no config.json yet); ``name``
    defaults to the directory name without its ``_s<seed>`` suffix."""
    config_path = run_dir / "config.json"
    if not config_path.exists():
        return []
    config = json.loads(config_path.read_text(encoding="utf-8"))["config"]
    method, seed = str(config["method"]), int(config["run"]["seed"])
    name = name or _SEED_SUFFIX.sub("", run_dir.name)
    rows = []
    files: tuple[tuple[Kind, str], ...] = (("train", "metrics.jsonl"), ("eval", "eval.jsonl"))
    for kind, file in files:
        for record in iter_jsonl(run_dir / file):
            step = int(record["step"])
            for metric, raw in record.items():
                value = _as_float(raw)
                if metric != "step" and value is not None:
                    rows.append(TidyRow(run_dir.name, name, method, seed, kind, step, metric,
                                        value))
    return rows


def tidy(sweep_dir: str | Path) -> list[TidyRow]:
    """Every logged value of every run of a sweep, in run order, then train before eval, then
    step order as logged."""
    sweep_dir = Path(sweep_dir)
    return [row for run_dir, name in _run_dirs(sweep_dir) for row in run_rows(run_dir, name)]


_COLUMNS = [f.name for f in fields(TidyRow)]


def write_tidy(rows: Sequence[TidyRow], sweep_dir: str | Path) -> tuple[list[Path], str]:
    """Write ``results.csv`` and, with pyarrow, ``results.parquet``; returns the files written
    and a note on how to get Parquet (empty when it was written)."""
    sweep_dir = Path(sweep_dir)
    csv_path = sweep_dir / RESULTS_CSV
    with csv_path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(_COLUMNS)
        writer.writerows([getattr(r, c) for c in _COLUMNS] for r in rows)
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return [csv_path], PARQUET_HINT
    table = pa.table({c: [getattr(r, c) for r in rows] for c in _COLUMNS},
                     schema=pa.schema([("run", pa.string()), ("name", pa.string()),
                                       ("method", pa.string()), ("seed", pa.int64()),
                                       ("kind", pa.string()), ("step", pa.int64()),
                                       ("metric", pa.string()), ("value", pa.float64())]))
    parquet_path = sweep_dir / RESULTS_PARQUET
    pq.write_table(table, parquet_path)
    return [csv_path, parquet_path], ""


def _kind(value: object) -> Kind:
    if value == "train" or value == "eval":
        return value
    raise ValueError(f"kind must be 'train' or 'eval', not {value!r}")


def load_tidy(path: str | Path) -> list[TidyRow]:
    """Read ``results.csv`` (or ``results.parquet``, which needs pyarrow) back into rows; a
    sweep directory reads its ``results.csv``."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_CSV
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        columns = pq.read_table(path).to_pydict()
        records: Iterable[dict[str, Any]] = (
            dict(zip(columns, values, strict=True)) for values in zip(*columns.values(),
                                                                       strict=True))
    else:
        with path.open(newline="", encoding="utf-8") as f:
            records = list(csv.DictReader(f))
    return [TidyRow(run=str(r["run"]), name=str(r["name"]), method=str(r["method"]),
                    seed=int(r["seed"]), kind=_kind(r["kind"]), step=int(r["step"]),
                    metric=str(r["metric"]), value=float(r["value"])) for r in records]


# ---------------------------------------------------------------------------- aggregations


@dataclass
class _Series:
    """One name's values of one metric: ``seed -> step -> value``."""

    method: str
    kind: Kind
    by_seed: dict[int, dict[int, float]]


def _index(rows: Iterable[TidyRow]) -> dict[str, dict[str, _Series]]:
    """``metric -> name -> series`` in one pass, names in first-seen order; a repeated
    (seed, step) keeps the last value."""
    out: dict[str, dict[str, _Series]] = {}
    for r in rows:
        series = out.setdefault(r.metric, {}).get(r.name)
        if series is None:
            series = out[r.metric][r.name] = _Series(r.method, r.kind, {})
        series.by_seed.setdefault(r.seed, {})[r.step] = r.value
    return out


def final_table(rows: Sequence[TidyRow], metrics: Sequence[str] | None = None
                ) -> list[FinalCell]:
    """Per name and metric: each seed's value at its last logged step, then mean, sample sd
    (ddof = 1) and n across seeds. ``metrics`` defaults to every evaluation metric except
    timings. Cells are ordered by name, then by ``metrics``."""
    if metrics is None:
        metrics = list(dict.fromkeys(r.metric for r in rows
                                     if r.kind == "eval" and not r.metric.startswith("time/")))
    index = _index(rows)
    cells = []
    for name in dict.fromkeys(r.name for r in rows):
        for metric in metrics:
            series = index.get(metric, {}).get(name)
            if series is None:
                continue
            seeds = tuple(sorted(series.by_seed))
            steps = tuple(max(series.by_seed[s]) for s in seeds)
            values = tuple(series.by_seed[s][t] for s, t in zip(seeds, steps, strict=True))
            mean, sd = mean_sd(values)
            cells.append(FinalCell(name, series.method, metric, mean, sd, len(seeds), seeds,
                                   values, steps))
    return cells


def _crossings(metric: str, named: dict[str, _Series], threshold: float,
               direction: Direction) -> list[Crossing]:
    if direction not in ("<=", ">="):
        raise ValueError(f"direction must be '<=' or '>=', not {direction!r}")
    out = []
    for name, series in named.items():
        steps: list[tuple[int, int | None]] = []
        for seed in sorted(series.by_seed):
            hit = [step for step, v in sorted(series.by_seed[seed].items())
                   if (v <= threshold if direction == "<=" else v >= threshold)]
            steps.append((seed, hit[0] if hit else None))
        crossed = [float(s) for _, s in steps if s is not None]
        mean, sd = mean_sd(crossed)
        out.append(Crossing(name, series.method, metric, threshold, direction, mean, sd,
                            len(crossed), len(steps), tuple(steps)))
    return out


def crossings(rows: Sequence[TidyRow], metric: str, threshold: float,
              direction: Direction = "<=") -> list[Crossing]:
    """Per name: each seed's first step where ``metric`` is ≤ (``<=``) or ≥ (``>=``)
    ``threshold``, then mean and sample sd (ddof = 1) of those steps over the seeds that
    crossed, with how many did. Ordered by name."""
    return _crossings(metric, _index(rows).get(metric, {}), threshold, direction)


def _curves(metric: str, named: dict[str, _Series]) -> list[CurvePoint]:
    points = []
    for name, series in named.items():
        for step in sorted({s for values in series.by_seed.values() for s in values}):
            values = [v[step] for v in series.by_seed.values() if step in v]
            points.append(CurvePoint(name, series.method, series.kind, metric, step,
                                     mean_sd(values)[0], sem(values), len(values)))
    return points


def curves(rows: Sequence[TidyRow], metric: str) -> list[CurvePoint]:
    """Per name and step: mean and standard error of the mean (sample sd / √n) over the seeds
    that logged that step, with n. Ordered by name, then step."""
    return _curves(metric, _index(rows).get(metric, {}))


# ---------------------------------------------------------------------------------- output


def _g(value: float) -> str:
    return "nan" if math.isnan(value) else f"{value:.4g}"


def final_markdown(cells: Sequence[FinalCell]) -> str:
    """The final table as Markdown: one row per name, one column per metric,
    ``mean ± sd (n)``."""
    metrics = list(dict.fromkeys(c.metric for c in cells))
    by_key = {(c.name, c.metric): c for c in cells}
    names = list(dict.fromkeys(c.name for c in cells))
    method = {c.name: c.method for c in cells}
    lines = [f"Final evaluation: mean ± sd (n) of each seed's last value; {SD_NOTE}.", ""]
    if not cells:
        return "\n".join([*lines, "No run has logged these metrics yet."]) + "\n"
    lines += ["| name | method | " + " | ".join(f"`{m}`" for m in metrics) + " |",
              "| --- | --- |" + " --- |" * len(metrics)]
    for name in names:
        row = [f"{_g(c.mean)} ± {_g(c.sd)} ({c.n})" if (c := by_key.get((name, m))) else "–"
               for m in metrics]
        lines.append(f"| {name} | {method[name]} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def crossings_markdown(found: Sequence[Crossing]) -> str:
    """First crossings as Markdown: one row per name, one column per (metric, threshold),
    ``mean ± sd (crossed/seeds)``."""
    specs = list(dict.fromkeys((c.metric, c.direction, c.threshold) for c in found))
    by_key = {(c.name, c.metric, c.direction, c.threshold): c for c in found}
    names = list(dict.fromkeys(c.name for c in found))
    method = {c.name: c.method for c in found}
    lines = ["First step at which each seed's value crosses the threshold: mean ± sd over the "
             "seeds that crossed (crossed/seeds); sd is the sample standard deviation "
             "(ddof = 1; nan when fewer than two crossed).", ""]
    if not found:
        return "\n".join([*lines, "No run has logged these metrics yet."]) + "\n"
    lines += ["| name | method | " + " | ".join(f"`{m}` {d} {t:g}" for m, d, t in specs) + " |",
              "| --- | --- |" + " --- |" * len(specs)]
    for name in names:
        row = []
        for m, d, t in specs:
            c = by_key.get((name, m, d, t))
            if c is None:
                row.append("–")
            elif c.n_crossed == 0:
                row.append(f"not reached (0/{c.n_seeds})")
            else:
                row.append(f"{_g(c.mean_step)} ± {_g(c.sd_step)} ({c.n_crossed}/{c.n_seeds})")
        lines.append(f"| {name} | {method[name]} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def _write_dataclass_csv(path: Path, items: Sequence[Any], columns: Sequence[str]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for item in items:
            record = asdict(item)
            writer.writerow([" ".join(map(str, record[c])) if isinstance(record[c], tuple | list)
                             else record[c] for c in columns])
    return path


def aggregate(sweep_dir: str | Path, metrics: Sequence[str] | None = None,
              crossing_specs: Sequence[CrossingSpec] = DEFAULT_CROSSINGS) -> Aggregate:
    """Read a sweep's runs and write, beside them: ``results.csv`` (+ ``results.parquet``),
    ``final.csv`` / ``final.md``, ``crossings.csv`` / ``crossings.md`` and ``curves.csv``
    (every metric's mean ± SEM per name and step)."""
    sweep_dir = Path(sweep_dir)
    rows = tidy(sweep_dir)
    files, note = write_tidy(rows, sweep_dir)
    final = final_table(rows, metrics)
    files.append(_write_dataclass_csv(sweep_dir / "final.csv", final,
                                      ["name", "method", "metric", "mean", "sd", "n", "seeds",
                                       "values", "steps"]))
    (sweep_dir / "final.md").write_text(final_markdown(final), encoding="utf-8")
    files.append(sweep_dir / "final.md")
    found = [c for spec in crossing_specs
             for c in crossings(rows, spec.metric, spec.threshold, spec.direction)]
    crossing_rows = [{**asdict(c), "steps": " ".join(f"{seed}:{'' if s is None else s}"
                                                     for seed, s in c.steps)} for c in found]
    path = sweep_dir / "crossings.csv"
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=[f.name for f in fields(Crossing)])
        writer.writeheader()
        writer.writerows(crossing_rows)
    files.append(path)
    (sweep_dir / "crossings.md").write_text(crossings_markdown(found), encoding="utf-8")
    files.append(sweep_dir / "crossings.md")
    all_points = [p for m, named in _index(rows).items() for p in _curves(m, named)]
    files.append(_write_dataclass_csv(sweep_dir / "curves.csv", all_points,
                                      [f.name for f in fields(CurvePoint)]))
    return Aggregate(rows=len(rows), final=final, crossings=found, files=files,
                     parquet_note=note)
