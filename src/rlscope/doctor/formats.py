"""The readers of `rlscope.doctor.importers`, one per ``--format``: each reads one path into
`MetricTable`s, naming the framework so its metric names are translated (`rlscope.doctor.naming`).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rlscope.doctor.naming import _renamer, guess_framework
from rlscope.doctor.table import DoctorError, MetricTable
from rlscope.doctor.verl import read_verl
from rlscope.metrics import readers
from rlscope.results import number as _number

STEP_KEYS = ("step", "_step", "global_step", "Step", "iteration", "train/global_step",
             "trainer/global_step", "epoch_step")


def _flatten(obj: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in obj.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}/")
        else:
            yield f"{prefix}{key}", value


def _add_row(table: MetricTable, row: dict[str, Any], step_key: str | None, index: int,
             rename: Callable[[str], str]) -> None:
    step = _number(row.get(step_key)) if step_key else float(index)
    if step is None:
        step = float(index)
    for key, value in _flatten(row):
        if key == step_key:
            continue
        number = _number(value)
        if number is not None:
            table.add(step, rename(key), number)


def _step_key(keys: list[str]) -> str | None:
    return next((k for k in STEP_KEYS if k in keys), None)


def _lines(path: Path) -> Iterator[str]:
    with path.open(encoding="utf-8-sig", errors="replace", newline="") as f:
        yield from f


def read_jsonl(path: Path, fmt: str, framework: str | None = None) -> MetricTable:
    """JSON lines: one object per line; the step from a step key, else the line index."""
    table = MetricTable(source=path.name, fmt=fmt)
    rename: Callable[[str], str] | None = None
    index = 0
    for line_no, line in enumerate(_lines(path), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError) as e:  # ValueError: also an int over 4300 digits
            table.problem(line_no, f"not JSON ({e.__class__.__name__}): {line.strip()[:60]!r}")
            continue
        if not isinstance(row, dict):
            table.problem(line_no, "not a JSON object")
            continue
        if rename is None:
            framework = framework or guess_framework(list(row))
            rename = _renamer(table, framework)
        _add_row(table, row, _step_key(list(row)), index, rename)
        index += 1
    return table


def read_json(path: Path) -> MetricTable:
    """A JSON array of step objects (the whole file is parsed; the step from a step key, else
    the index)."""
    try:
        rows = json.loads(path.read_text(encoding="utf-8-sig"))
    except (ValueError, RecursionError) as e:  # JSON and UTF-8 errors are ValueErrors
        raise DoctorError(f"{path}: not a JSON array of step objects ({e.__class__.__name__}: "
                          f"{str(e)[:80]})") from None
    if not isinstance(rows, list):
        raise DoctorError(f"{path}: expected a JSON array of step objects, got "
                          f"{type(rows).__name__}")
    table = MetricTable(source=path.name, fmt="json")
    objects = [r for r in rows if isinstance(r, dict)]
    if len(objects) < len(rows):
        table.problem(None, f"{len(rows) - len(objects)} array entries are not objects")
    keys = list(dict.fromkeys(k for r in objects[:50] for k in r))
    framework = guess_framework(keys)
    rename = _renamer(table, framework)
    for i, row in enumerate(objects):
        _add_row(table, row, _step_key(list(row)), i, rename)
    return table


def _points_tables(runs: dict[str, list[readers.Point]], fmt: str,
                   source: str) -> list[MetricTable]:
    """Tables from the raw points of the TensorBoard and W&B readers, one per run."""
    tables = []
    for run, points in runs.items():
        table = MetricTable(source=source if run == "." else run, fmt=fmt)
        framework = guess_framework(list(dict.fromkeys(name for _, name, _ in points)))
        rename = _renamer(table, framework)
        for step, name, value in points:
            table.add(step, rename(name), value)
        tables.append(table)
    return tables


def read_tensorboard(path: Path) -> list[MetricTable]:
    """A TensorBoard log directory (or one event file): one table per run directory."""
    root = path.parent if path.is_file() else path
    try:
        runs = readers.tensorboard_runs(root)
    except readers.MissingReader as e:
        raise DoctorError(str(e)) from None
    except readers.BadLog as e:
        raise DoctorError(str(e)) from None
    if not runs:
        raise DoctorError(f"{path}: no {readers.TB_GLOB} files")
    return _points_tables(runs, "tensorboard", root.name)


def read_wandb_run(path: Path) -> list[MetricTable]:
    """A W&B offline run directory, a ``wandb/`` folder or a ``run-*.wandb`` file."""
    try:
        runs = readers.wandb_runs(path)
    except readers.MissingReader as e:
        raise DoctorError(str(e)) from None
    except readers.BadLog as e:
        raise DoctorError(f"{path}: {e}") from None
    if not runs:
        raise DoctorError(f"{path}: no W&B run-*.wandb file (expected wandb/offline-run-*/)")
    return _points_tables(runs, "wandb_run", path.name)


def read_run_dir(path: Path) -> MetricTable:
    """An rlscope run directory: metrics and evaluations, with the run's config."""
    if not (path / "metrics.jsonl").exists():
        raise DoctorError(f"{path} is a directory without metrics.jsonl: expected an rlscope "
                          "run directory (runs/<name>/)")
    table = read_jsonl(path / "metrics.jsonl", "run")
    table.source = path.name
    if (path / "eval.jsonl").exists():
        evals = read_jsonl(path / "eval.jsonl", "run")
        for name in evals.names():
            for step, value in zip(*evals.series(name), strict=True):
                table.add(float(step), name, float(value))
        table.problems += evals.problems
    for extra in ("config.json", "status.json"):
        if (path / extra).exists():
            try:
                value = json.loads((path / extra).read_text())
            except (ValueError, RecursionError) as e:  # JSON and UTF-8 errors are ValueErrors
                table.problem(None, f"{extra}: {e.__class__.__name__}: {str(e)[:80]}")
                continue
            if extra == "status.json":
                table.config |= {"status": value}
            elif isinstance(value, dict):
                table.config |= value
            else:
                table.problem(None, f"{extra}: expected a JSON object, got {type(value).__name__}")
    return table


def read_trl(path: Path) -> MetricTable:
    """A TRL ``trainer_state.json``: ``log_history`` entries keyed by ``step``; the final
    summary entry (``train_runtime``, ...) is kept under its own names."""
    try:
        state = json.loads(path.read_text(encoding="utf-8-sig"))
    except (ValueError, RecursionError) as e:  # JSON and UTF-8 errors are ValueErrors
        raise DoctorError(f"{path}: not a JSON trainer_state.json ({e})") from None
    if not isinstance(state, dict) or not isinstance(state.get("log_history"), list):
        raise DoctorError(f"{path}: a TRL trainer_state.json needs a 'log_history' list")
    table = MetricTable(source=path.name, fmt="trl",
                        config={k: v for k, v in state.items() if k != "log_history"})
    rename = _renamer(table, "trl")
    epochs: dict[Any, Any] = {}
    for i, entry in enumerate(state["log_history"]):
        if not isinstance(entry, dict):
            table.problem(None, f"log_history[{i}] is not an object")
            continue
        # transformers stamps every log entry with `epoch`: the training and the evaluation
        # entries of one step carry the same value, which is not a step logged twice
        step = _number(entry.get("step"))
        if "epoch" in entry and step in epochs and epochs[step] == entry["epoch"]:
            entry = {k: v for k, v in entry.items() if k != "epoch"}
        elif "epoch" in entry:
            epochs[step] = entry["epoch"]
        _add_row(table, entry, "step" if "step" in entry else None, i, rename)
    return table


def read_csv(path: Path, fmt: str) -> list[MetricTable]:
    """CSV with a header: a W&B chart export (one table per run), or one table with a step
    column (the row index otherwise)."""
    lines = _lines(path)
    reader = csv.reader(lines)
    try:
        header = next(reader)
    except (StopIteration, csv.Error) as e:
        raise DoctorError(f"{path}: no CSV header ({e})") from None
    chart = "Step" in header and any(" - " in h for h in header)
    tables: dict[str, MetricTable] = {}
    columns: list[tuple[int, MetricTable, str] | None] = []
    bad: dict[str, int] = {}
    step_col = header.index("Step") if chart else next(
        (header.index(k) for k in STEP_KEYS if k in header), None)
    if chart:
        for h in header:
            run, sep, metric = h.partition(" - ")
            if not sep or metric.endswith(("__MIN", "__MAX")):
                columns.append(None)
                continue
            if run not in tables:
                tables[run] = MetricTable(source=run, fmt="wandb")
            columns.append((len(columns), tables[run], metric))
        names = [c[2] for c in columns if c]
    else:
        table = MetricTable(source=path.name, fmt=fmt)
        tables[path.name] = table
        names = [h for i, h in enumerate(header) if i != step_col and h.strip()]
        # an unnamed first column is a pandas index (W&B's history export)
        columns = [None if i == step_col or not h.strip() else (i, table, h)
                   for i, h in enumerate(header)]
    framework = guess_framework(names)
    renames = {id(t): _renamer(t, framework) for t in tables.values()}
    first = next(iter(tables.values()))
    index = 0
    while True:
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as e:
            first.problem(reader.line_num, f"malformed CSV: {e}")
            continue
        if len(row) != len(header):
            first.problem(reader.line_num, f"{len(row)} cells, header has {len(header)}")
            continue
        index += 1
        raw_step = row[step_col] if step_col is not None else None
        step = float(index - 1) if raw_step is None else _number(raw_step)
        if step is None:
            first.problem(reader.line_num, f"step {raw_step!r} is not a number")
            continue
        for col in columns:
            if col is None or not row[col[0]].strip():
                continue
            value = _number(row[col[0]])
            if value is None:
                bad[col[2]] = bad.get(col[2], 0) + 1
                continue
            col[1].add(step, renames[id(col[1])](col[2]), value)
    for name, count in bad.items():
        first.problem(None, f"column {name!r}: {count} non-numeric cells skipped")
    return list(tables.values())


def read_verl_log(path: Path) -> MetricTable:
    """A verl console log (`rlscope.doctor.verl`)."""
    table = MetricTable(source=path.name, fmt="verl")
    read_verl(_lines(path), table, _renamer(table, "verl"))
    return table
