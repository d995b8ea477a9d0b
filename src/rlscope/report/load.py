"""What the report reads: a run directory or a sweep directory, as one `ReportInput`.

- A **run directory** (``runs/<name>/``) has ``metrics.jsonl``; its ``config.json``,
  ``eval.jsonl``, ``samples.jsonl`` and ``status.json`` are read when present.
- A **sweep directory** (written by ``rlscope sweep``) has ``results.csv`` (tidy rows, the
  source of every curve and final value), and optionally ``sweep.json`` (the manifest, with
  one record per run under ``runs``: ``run``, ``name``, ``seed``, ``status``, ``error``, ...),
  ``crossings.csv`` and the run directories ``runs/<name>_s<seed>/`` (configs, samples and
  the doctor's input). A run without rows in ``results.csv`` (one that failed before logging)
  is still listed: from ``sweep.json``'s records when it has them, else from ``runs/``.

Nothing here imports torch or matplotlib.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rlscope.report.tidy import ReportError, TidyRow, finite, read_results_csv, rows_from_run_dir

RUN_ID = re.compile(r"^(?P<name>.+)_s(?P<seed>\d+)$")
"""A sweep's run id: the name, ``_s`` and the seed."""


@dataclass(frozen=True)
class RunInfo:
    """One run: its id, name (the id without the seed), method, seed and directory files."""

    run: str
    name: str
    method: str
    seed: int
    run_dir: Path | None
    """None when ``results.csv`` names a run whose directory is not there."""
    config: dict[str, Any] = field(default_factory=dict)
    """``config.json``: ``config``, ``derived``, ``method_spec``, ``task_description`` and the
    environment (versions, device, platform)."""
    status: dict[str, Any] = field(default_factory=dict)
    """``status.json``: status, steps, wall time."""
    record: dict[str, Any] = field(default_factory=dict)
    """Its record in ``sweep.json``'s ``runs`` (status and error of a run that failed)."""


@dataclass(frozen=True)
class ReportInput:
    """Everything the report shows, read once."""

    path: Path
    kind: Literal["run", "sweep"]
    rows: list[TidyRow]
    """The tidy rows of the report's metrics only."""
    runs: list[RunInfo]
    """Sorted by (name, seed)."""
    manifest: dict[str, Any] = field(default_factory=dict)
    """``sweep.json`` for a sweep; empty for a run."""
    crossings: tuple[list[str], list[list[str]]] | None = None
    """``crossings.csv`` as (header, rows) when present."""

    @property
    def names(self) -> list[str]:
        return sorted({r.name for r in self.runs})


def run_records(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``sweep.json``'s per-run records by run id (empty when it has none)."""
    runs = manifest.get("runs")
    if not isinstance(runs, list):
        return {}
    return {str(r["run"]): r for r in runs if isinstance(r, dict) and "run" in r}


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``; empty when the file is missing or not an object (a report
    on a crashed run should still render)."""
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return obj if isinstance(obj, dict) else {}


def read_csv_table(path: Path) -> tuple[list[str], list[list[str]]] | None:
    """A CSV file as (header, rows), None when it is missing or empty."""
    if not path.exists():
        return None
    with path.open(newline="", encoding="utf-8") as f:
        table = list(csv.reader(f))
    return (table[0], table[1:]) if table else None


def _run_info(run_dir: Path, run: str, name: str | None = None, method: str | None = None,
              seed: int | None = None, record: dict[str, Any] | None = None) -> RunInfo:
    """A run's record; a directory that is not there gives a record without files."""
    config = read_json(run_dir / "config.json")
    cfg = config.get("config", {})
    run_cfg = cfg.get("run", {}) if isinstance(cfg, dict) else {}
    if seed is None:
        seed = int(run_cfg.get("seed", 0))
    return RunInfo(run=run, name=name or run_cfg.get("name") or run_dir.name,
                   method=method or str(cfg.get("method", "")), seed=seed,
                   run_dir=run_dir if run_dir.is_dir() else None, config=config,
                   status=read_json(run_dir / "status.json"), record=record or {})


def load_run(path: Path, metrics: Collection[str]) -> ReportInput:
    """A single run directory (its name is the directory's name)."""
    info = _run_info(path, path.name, name=path.name)
    rows = rows_from_run_dir(path, info.run, info.name, info.method, info.seed, metrics)
    return ReportInput(path=path, kind="run", rows=rows, runs=[info])


def load_sweep(path: Path, metrics: Collection[str]) -> ReportInput:
    """A sweep directory: rows from ``results.csv``, runs from it and from ``runs/``."""
    rows = read_results_csv(path / "results.csv", metrics)
    manifest = read_json(path / "sweep.json")
    records = run_records(manifest)
    runs: dict[str, RunInfo] = {}
    with (path / "results.csv").open(newline="", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            if r["run"] not in runs:
                seed = finite(r["seed"])
                runs[r["run"]] = _run_info(path / "runs" / r["run"], r["run"], r["name"],
                                           r["method"], int(seed or 0), records.get(r["run"]))
    runs_root = path / "runs"
    others = list(records) if records else sorted(
        d.name for d in (runs_root.iterdir() if runs_root.is_dir() else []) if d.is_dir())
    for run in others:
        if run in runs:
            continue
        record, m = records.get(run, {}), RUN_ID.match(run)
        seed = finite(record.get("seed"))
        if seed is None and m:
            seed = float(m["seed"])
        runs[run] = _run_info(runs_root / run, run, record.get("name") or (m["name"] if m else run),
                              None, None if seed is None else int(seed), record)
    return ReportInput(path=path, kind="sweep", rows=rows,
                       runs=sorted(runs.values(), key=lambda r: (r.name, r.seed, r.run)),
                       manifest=manifest, crossings=read_csv_table(path / "crossings.csv"))


def load(path: str | Path, metrics: Collection[str]) -> ReportInput:
    """A sweep directory (has ``results.csv``) or a run directory (has ``metrics.jsonl``)."""
    path = Path(path)
    if not path.is_dir():
        raise ReportError(f"{path} is not a directory: expected a run directory (runs/<name>/) "
                          "or a sweep directory (with results.csv)")
    if (path / "results.csv").exists():
        return load_sweep(path, metrics)
    if (path / "metrics.jsonl").exists():
        return load_run(path, metrics)
    raise ReportError(f"{path} has neither results.csv (a sweep) nor metrics.jsonl (a run)")
