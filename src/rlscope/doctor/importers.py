"""Read a run directory or a foreign log into `MetricTable`s (METRICS.md, "The doctor").

Formats (``--format``; ``auto`` sniffs the first 64 KB):

- ``run``: an rlscope run directory (``metrics.jsonl``, ``eval.jsonl``, ``config.json``);
- ``verl``: a verl console log (`rlscope.doctor.verl`);
- ``trl``: a TRL ``trainer_state.json`` (its ``log_history``);
- ``wandb``: a W&B CSV export, either a chart export (``Step`` and ``<run> - <metric>``
  columns with ``__MIN``/``__MAX`` companions; one table per run) or a run-history export
  (``_step`` and plain metric columns);
- ``tinker``: a tinker-cookbook ``metrics.jsonl``;
- ``jsonl`` / ``csv``: any JSON-lines or CSV file with a step column;
- ``json``: a JSON array of step objects (``[{"step": 1, ...}, ...]``);
- ``tensorboard``: a directory with ``events.out.tfevents.*`` files (verl's and TRL's local
  logger; one table per run directory), read with TensorBoard's ``EventAccumulator``;
- ``wandb_run``: a W&B offline run directory (``wandb/offline-run-*``), a ``wandb/`` folder or
  a ``run-*.wandb`` file (`rlscope.metrics.readers`).

Where to add an importer: a reader ``(Path) -> list[MetricTable]`` in `rlscope.doctor.formats`
(one table per run; name the framework with `rlscope.doctor.naming._renamer` so its names are
translated), one entry in `READERS`, and, for
``auto``, one entry in the sniffing order: `DIRECTORY_SIGNS` for a directory (a format with a
directory sign is one whose reader takes a directory), `NAME_SIGNS` for a file name,
`TEXT_SIGNS` for a file's first 64 KB of text. The first sign that matches wins. Then a line in
the list above, in docs/doctor.md, and its cases in tests/test_doctor_import.py.

A UTF-8 byte-order mark is ignored. Two foreign names for one quantity are never merged into
one series; a step logged twice keeps its last value, and the table's ``import_notes`` say so.

Foreign names are translated to ours where a translation exists (`rlscope.doctor.translate`);
every other numeric key is kept under its own name. Files are streamed, so memory grows with
the number of values kept, not with the file. A malformed line is reported with its line
number and skipped; an empty, binary or unreadable file raises `DoctorError` with a message
that says what was expected.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from pathlib import Path

from rlscope.doctor.formats import (
    read_csv,
    read_json,
    read_jsonl,
    read_run_dir,
    read_tensorboard,
    read_trl,
    read_verl_log,
    read_wandb_run,
)
from rlscope.doctor.naming import _finish, guess_framework
from rlscope.doctor.table import DoctorError, ImportResult, MetricTable
from rlscope.doctor.verl import RECORD
from rlscope.metrics import readers

SNIFF_BYTES = 65536


def _first_line(text: str) -> str:
    stripped = text.lstrip()
    return stripped.splitlines()[0] if stripped else ""


def _tinker_jsonl(text: str) -> bool:
    """A JSON-lines file whose first object has tinker-cookbook's metric names."""
    if not text.lstrip().startswith("{"):
        return False
    try:
        keys = list(json.loads(_first_line(text)))
    except (ValueError, TypeError, RecursionError):  # ValueError: also an int over 4300 digits
        keys = []
    return guess_framework(keys) == "tinker"


def _wandb_csv(text: str) -> bool:
    """A CSV header of a W&B chart export (``Step`` and ``<run> - <metric>`` columns) or of a
    run-history export (``_step``)."""
    first_line = _first_line(text)
    if "," not in first_line:
        return False
    header = next(csv.reader(io.StringIO(first_line)), [])
    return ("Step" in header and any(" - " in h for h in header)) or "_step" in header


def _tinker_log_dir(path: Path) -> bool:
    """A tinker-cookbook ``log_path``: a ``metrics.jsonl`` with the cookbook's metric names
    (an rlscope run directory has a ``metrics.jsonl`` too, with ours)."""
    metrics = path / "metrics.jsonl"
    return metrics.is_file() and _tinker_jsonl(_head(metrics).decode("utf-8", errors="replace"))


def _read_tinker(path: Path) -> list[MetricTable]:
    """tinker-cookbook's ``metrics.jsonl``, given itself or its ``log_path`` directory."""
    if not path.is_dir():
        return [read_jsonl(path, "tinker", "tinker")]
    table = read_jsonl(path / "metrics.jsonl", "tinker", "tinker")
    table.source = path.name
    return [table]


def _trl_state(path: Path) -> Path | None:
    """The ``trainer_state.json`` of a TRL checkpoint directory, or of the latest
    ``checkpoint-<N>`` of a TRL ``output_dir``; None when there is none."""
    if (path / "trainer_state.json").is_file():
        return path / "trainer_state.json"
    numbered = [(int(c.name.removeprefix("checkpoint-")), c) for c in path.glob("checkpoint-*")
                if c.name.removeprefix("checkpoint-").isdigit()
                and (c / "trainer_state.json").is_file()]
    return max(numbered)[1] / "trainer_state.json" if numbered else None


def _read_trl(path: Path) -> list[MetricTable]:
    """TRL's ``trainer_state.json``, given itself, its checkpoint directory or the
    ``output_dir`` (the latest checkpoint: its log history holds every earlier step)."""
    state = _trl_state(path) if path.is_dir() else path
    if state is None:
        raise DoctorError(f"{path} holds no trainer_state.json (nor checkpoint-<N>/ with one)")
    table = read_trl(state)
    if path.is_dir():
        table.source = path.name
    return [table]


DIRECTORY_SIGNS: tuple[tuple[str, Callable[[Path], bool]], ...] = (
    ("tinker", _tinker_log_dir),
    ("trl", lambda p: _trl_state(p) is not None),
    ("run", lambda p: (p / "metrics.jsonl").exists()),
    ("wandb_run", lambda p: bool(readers.wandb_files(p))),
    ("tensorboard", readers.is_tensorboard_dir),
)
"""How ``auto`` tells a directory's format, in order (none matching: ``run``, whose reader says
what a run directory needs). The formats named here are the ones whose reader takes a
directory."""
NAME_SIGNS: tuple[tuple[str, Callable[[Path], bool]], ...] = (
    ("tensorboard", lambda p: p.name.startswith("events.out.tfevents.")),
    ("wandb_run", lambda p: p.suffix == ".wandb"),
)
"""How ``auto`` tells a file's format from its name, in order, before reading it."""
TEXT_SIGNS: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("trl", lambda text: text.lstrip().startswith("{") and '"log_history"' in text),
    ("json", lambda text: text.lstrip().startswith("[")),
    ("tinker", _tinker_jsonl),
    ("jsonl", lambda text: text.lstrip().startswith("{")),
    ("verl", lambda text: RECORD.search(text) is not None),
    ("wandb", _wandb_csv),
    ("csv", lambda text: "," in _first_line(text)),
)
"""How ``auto`` tells a file's format from its first 64 KB of text (a UTF-8 byte-order mark
removed), in order: the first that matches wins."""
DIRECTORY_FORMATS = tuple(fmt for fmt, _ in DIRECTORY_SIGNS)


def sniff(path: Path) -> str:
    """The format of ``path`` from its name and first bytes (DoctorError when unreadable): the
    first matching sign of `DIRECTORY_SIGNS`, `NAME_SIGNS` or `TEXT_SIGNS`."""
    if path.is_dir():
        return next((fmt for fmt, sign in DIRECTORY_SIGNS if sign(path)), "run")
    named = next((fmt for fmt, sign in NAME_SIGNS if sign(path)), None)
    if named is not None:
        return named
    head = _head(path)
    if not head.strip():
        raise DoctorError(f"{path} is empty: expected a training log (verl console log, TRL "
                          "trainer_state.json, W&B CSV export, metrics.jsonl or a CSV/JSONL "
                          "with a step column)")
    if _binary_share(head) > 0.3:
        raise DoctorError(f"{path} looks binary: the doctor reads text logs (verl console log, "
                          "trainer_state.json, CSV or JSONL)")
    text = head.decode("utf-8", errors="replace")
    sniffed = next((fmt for fmt, sign in TEXT_SIGNS if sign(text)), None)
    if sniffed is not None:
        return sniffed
    raise DoctorError(f"{path}: could not tell its format; pass --format "
                      f"({', '.join(FORMATS[1:])})")


def _head(path: Path) -> bytes:
    """The first SNIFF_BYTES of ``path``, a UTF-8 byte-order mark removed."""
    with path.open("rb") as f:
        return f.read(SNIFF_BYTES).removeprefix(b"\xef\xbb\xbf")


def _binary_share(data: bytes) -> float:
    """The share of the first 4 KB that is neither printable ASCII, whitespace, nor part of
    valid UTF-8 text: a log with a line of junk is text, a checkpoint is not."""
    sample = data[:4096]
    if not sample:
        return 0.0
    text = sample.decode("utf-8", errors="replace")
    odd = sum(ch == "\ufffd" or (ord(ch) < 32 and ch not in "\t\n\r\x1b") for ch in text)
    return odd / len(text)


Reader = Callable[[Path], list[MetricTable]]
"""Reads one path into its tables (one per run); raises DoctorError when it cannot."""

READERS: dict[str, Reader] = {
    "run": lambda p: [read_run_dir(p)],
    "verl": lambda p: [read_verl_log(p)],
    "trl": _read_trl,
    "wandb": lambda p: read_csv(p, "wandb"),
    "tinker": _read_tinker,
    "jsonl": lambda p: [read_jsonl(p, "jsonl")],
    "json": lambda p: [read_json(p)],
    "csv": lambda p: read_csv(p, "csv"),
    "tensorboard": read_tensorboard,
    "wandb_run": read_wandb_run,
}
"""The readers by ``--format`` name, in the order ``--help`` and errors list them."""
FORMATS = ("auto", *READERS)


def load(path: str | Path, fmt: str = "auto") -> ImportResult:
    """Read ``path`` as ``fmt`` (``auto`` sniffs). Raises DoctorError for an unusable file."""
    p = Path(path)
    if not p.exists():
        raise DoctorError(f"{p} does not exist")
    if fmt not in FORMATS:
        raise DoctorError(f"--format {fmt!r} is unknown; valid: {', '.join(FORMATS)}")
    if fmt == "auto":
        fmt = sniff(p)
    elif p.is_dir() and fmt not in DIRECTORY_FORMATS:
        raise DoctorError(f"{p} is a directory; --format {fmt} reads a file")
    elif p.is_file() and not _head(p).strip():
        raise DoctorError(f"{p} is empty")
    tables = READERS[fmt](p)
    for table in tables:
        _finish(table, table.framework)
    for table in tables:
        if table.n_points == 0 and not table.problems:
            table.problem(None, "no numeric metrics found")
    if all(t.n_points == 0 for t in tables):
        detail = "; ".join(str(p) for t in tables for p in t.problems[:3])
        raise DoctorError(f"{p}: read as {fmt}, but no metric values were found"
                          + (f" ({detail})" if detail else ""))
    return ImportResult(path=str(p), fmt=fmt, tables=tables)
