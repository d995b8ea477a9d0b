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
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal

from rlscope.results import (
    RESULTS_COLUMNS,
    RESULTS_CSV,
    Kind,
    Series,
    TidyRow,
    curve,
    final_value,
    index,
    mean_sd,
    read_results_csv,
    read_run_dir,
    rows_from_records,
    sem,
)

Direction = Literal["<=", ">="]

RESULTS_PARQUET = "results.parquet"
PARQUET_HINT = "pip install pyarrow to also get results.parquet"
SD_NOTE = ("sd is the sample standard deviation across seeds (ddof = 1; nan when n = 1); "
           "n is the number of seeds")
_SEED_SUFFIX = re.compile(r"_s(\d+)$")


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


# ------------------------------------------------------------------------------- tidy rows


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
    return read_run_dir(run_dir, run_dir.name, name or _SEED_SUFFIX.sub("", run_dir.name),
                        str(config["method"]), int(config["run"]["seed"]))


def _readable_rows(run_dir: Path, name: str | None) -> list[TidyRow]:
    """`run_rows`, or ``[]`` for a run whose files cannot be read (a corrupt config.json,
    binary junk in a log): the sweep reports such a run as failed, with the reason."""
    try:
        return run_rows(run_dir, name)
    except (OSError, ValueError, KeyError, TypeError):
        return []


def tidy(sweep_dir: str | Path) -> list[TidyRow]:
    """Every logged value of every run of a sweep, in run order, then train before eval, then
    step order as logged; a run whose files cannot be read gives no rows."""
    sweep_dir = Path(sweep_dir)
    return [row for run_dir, name in _run_dirs(sweep_dir)
            for row in _readable_rows(run_dir, name)]


_COLUMNS = list(RESULTS_COLUMNS)


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


def load_tidy(path: str | Path) -> list[TidyRow]:
    """Read ``results.csv`` (or ``results.parquet``, which needs pyarrow) back into rows; a
    sweep directory reads its ``results.csv``."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_CSV
    if path.suffix != ".parquet":
        return read_results_csv(path)
    import pyarrow.parquet as pq

    columns = pq.read_table(path).to_pydict()
    return rows_from_records(dict(zip(columns, values, strict=True))
                             for values in zip(*columns.values(), strict=True))


# ---------------------------------------------------------------------------- aggregations


def final_table(rows: Sequence[TidyRow], metrics: Sequence[str] | None = None
                ) -> list[FinalCell]:
    """Per name and metric: each seed's value at its last logged step, then mean, sample sd
    (ddof = 1) and n across seeds. ``metrics`` defaults to every evaluation metric except
    timings. Cells are ordered by name, then by ``metrics``."""
    if metrics is None:
        metrics = list(dict.fromkeys(r.metric for r in rows
                                     if r.kind == "eval" and not r.metric.startswith("time/")))
    indexed = index(rows)
    cells = []
    for name in dict.fromkeys(r.name for r in rows):
        for metric in metrics:
            series = indexed.get(metric, {}).get(name)
            if series is None:
                continue
            last = series.last_values()
            final = final_value(series)
            cells.append(FinalCell(name, series.method, metric, final.mean, final.sd, final.n,
                                   tuple(series.seeds[run] for run, _, _ in last),
                                   tuple(value for _, _, value in last),
                                   tuple(step for _, step, _ in last)))
    return cells


def _crossings(metric: str, named: dict[str, Series], threshold: float,
               direction: Direction) -> list[Crossing]:
    if direction not in ("<=", ">="):
        raise ValueError(f"direction must be '<=' or '>=', not {direction!r}")
    out = []
    for name, series in named.items():
        steps: list[tuple[int, int | None]] = []
        for run in sorted(series.by_run, key=lambda run: series.seeds[run]):
            hit = [step for step, v in sorted(series.by_run[run].items())
                   if (v <= threshold if direction == "<=" else v >= threshold)]
            steps.append((series.seeds[run], hit[0] if hit else None))
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
    return _crossings(metric, index(rows).get(metric, {}), threshold, direction)


def _curves(metric: str, named: dict[str, Series]) -> list[CurvePoint]:
    points = []
    for name, series in named.items():
        c = curve(name, series)
        points += [CurvePoint(name, series.method, series.kind, metric, int(step), float(mean),
                              float(err), int(n))
                   for step, mean, err, n in zip(c.steps_S, c.mean_S, c.sem_S, c.n_S,
                                                 strict=True)]
    return points


def curves(rows: Sequence[TidyRow], metric: str) -> list[CurvePoint]:
    """Per name and step: mean and standard error of the mean (sample sd / √n) over the seeds
    that logged that step, with n. Ordered by name, then step."""
    return _curves(metric, index(rows).get(metric, {}))


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


SWITCH_METRICS = ("eval/test_error", "eval/top1_agreement", "eval/sampled_reward",
                  "eval/opd_reverse_kl", "eval/student_topk_mass", "eval/teacher_topk_mass")
"""The switch-row quantities `switch_markdown` shows (COMPANIONS.md §1, ``opd_topk_warmup``)."""


def switch_markdown(sweep_dir: Path) -> str:
    """``switch.md``: per name, mean ± sd over seeds of the evaluation rows tagged ``phase =
    "switch"`` (the OPD warm-up switch, before step W's update), and of final − switch
    ``eval/test_error`` (the last evaluation row's minus the switch row's); "" when no run has
    a switch row."""
    by_name: dict[str, dict[str, list[float]]] = {}
    for run_dir, name in _run_dirs(sweep_dir):
        try:
            records = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text(
                encoding="utf-8").splitlines() if line.strip()]
        except (OSError, ValueError):
            continue
        switch = next((r for r in records if r.get("phase") == "switch"), None)
        if switch is None:
            continue
        values = by_name.setdefault(name or _SEED_SUFFIX.sub("", run_dir.name), {})
        values.setdefault("step", []).append(float(switch["step"]))
        for metric in SWITCH_METRICS:
            if isinstance(switch.get(metric), (int, float)):
                values.setdefault(metric, []).append(float(switch[metric]))
        final = records[-1]
        if isinstance(final.get("eval/test_error"), (int, float)) \
                and isinstance(switch.get("eval/test_error"), (int, float)):
            values.setdefault("final − switch test_error", []).append(
                float(final["eval/test_error"]) - float(switch["eval/test_error"]))
    if not by_name:
        return ""
    columns = ["step", *SWITCH_METRICS, "final − switch test_error"]
    lines = ["# Warm-up switch rows (mean ± sd over seeds)", "",
             "| name | n | " + " | ".join(columns) + " |",
             "| --- | --- | " + " | ".join("---" for _ in columns) + " |"]
    for name, values in by_name.items():
        cells = []
        for column in columns:
            mean, sd = mean_sd(values.get(column, []))
            cells.append(f"{_g(mean)} ± {_g(sd)}")
        lines.append(f"| {name} | {len(values['step'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def aggregate(sweep_dir: str | Path, metrics: Sequence[str] | None = None,
              crossing_specs: Sequence[CrossingSpec] = DEFAULT_CROSSINGS) -> Aggregate:
    """Read a sweep's runs and write, beside them: ``results.csv`` (+ ``results.parquet``),
    ``final.csv`` / ``final.md``, ``crossings.csv`` / ``crossings.md`` and ``curves.csv``
    (every metric's mean ± SEM per name and step); ``switch.md`` where runs have warm-up
    switch rows (`switch_markdown`)."""
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
    switch = switch_markdown(sweep_dir)
    if switch:  # OPD warm-up sweeps (COMPANIONS.md §1)
        (sweep_dir / "switch.md").write_text(switch, encoding="utf-8")
        files.append(sweep_dir / "switch.md")
    all_points = [p for m, named in index(rows).items() for p in _curves(m, named)]
    files.append(_write_dataclass_csv(sweep_dir / "curves.csv", all_points,
                                      [f.name for f in fields(CurvePoint)]))
    return Aggregate(rows=len(rows), final=final, crossings=found, files=files,
                     parquet_note=note)


__all__ = ["DEFAULT_CROSSINGS", "RESULTS_CSV", "Aggregate", "Crossing", "CrossingSpec",
           "CurvePoint", "FinalCell", "TidyRow", "aggregate", "crossings", "crossings_markdown",
           "curves", "final_markdown", "final_table", "load_tidy", "mean_sd", "run_rows",
           "sem", "tidy", "write_tidy"]
