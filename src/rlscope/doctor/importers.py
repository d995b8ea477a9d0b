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

Where to add an importer: a reader ``(Path) -> list[MetricTable]`` (one table per run; name
the framework with `_renamer` so its names are translated), one entry in `READERS`, and, for
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rlscope.doctor.table import ImportResult, MetricTable
from rlscope.doctor.translate import TRANSLATIONS, translate
from rlscope.doctor.verl import RECORD, read_verl
from rlscope.metrics import readers
from rlscope.metrics.schema import is_registered
from rlscope.results import number as _number

STEP_KEYS = ("step", "_step", "global_step", "Step", "iteration", "train/global_step",
             "trainer/global_step", "epoch_step")
SNIFF_BYTES = 65536
# Name prefixes that identify a framework's metrics in a generic file.
FRAMEWORK_MARKERS = {
    "verl": ("actor/", "critic/", "timing_s/", "response_length/", "val-core/", "rollout_corr/"),
    "tinker": ("env/all/", "optim/kl_sample_train", "progress/", "time/total"),
    "trl": ("completions/", "frac_reward_zero_std", "clip_ratio/", "rewards/", "objective/",
            "policy/approxkl_avg", "ppo/loss/", "ppo/policy/", "ppo/mean_scores",
            "env/reward_mean", "tokens/responses_len"),
    "openrlhf": ("ppo_clip_ratio", "ppo_kl", "actor_lr", "actor_grad_norm", "rollout/reward_mean",
                 "timing/make_experience", "timing/ppo_train", "critic_loss"),
}


class DoctorError(ValueError):
    """A file the doctor cannot read at all; the message says why and what it expected."""


def _bare(name: str) -> str:
    """A name without the ``train/`` prefix that W&B and TensorBoard loggers add (TRL through
    transformers' callbacks, OpenRLHF's loggers)."""
    return name.removeprefix("train/")


PREFIXED = ("trl", "openrlhf")
"""Frameworks whose W&B and TensorBoard loggers prefix every training metric with ``train/``
(transformers' callbacks, OpenRLHF's ``logging_utils``)."""


def _renamer(table: MetricTable, framework: str | None) -> Callable[[str], str]:
    """Translate names of ``framework`` (recording the original name and the note).

    A canonical name is claimed by the first foreign name that maps to it; another foreign name
    mapping to the same canonical name is kept under its own name (two series are never merged
    into one) and `_finish` later gives the canonical name to the framework's preferred one.
    An untranslated name of a `PREFIXED` framework loses its logger's ``train/`` prefix (TRL's
    ``train/frac_reward_zero_std`` is read as ``frac_reward_zero_std``, the name the framework
    documents and the rules read) unless the bare name is taken.
    """
    cache: dict[str, str] = {}
    table.framework = framework

    def rename(name: str) -> str:
        hit = cache.get(name)
        if hit is not None:
            return hit
        canonical, note = translate(framework, name) if framework else (name, "")
        if framework and canonical == name and name != _bare(name):
            canonical, note = translate(framework, _bare(name))
            canonical = name if canonical == _bare(name) else canonical
        if framework in PREFIXED and canonical == name and name != _bare(name) \
                and _bare(name) not in cache.values() and _bare(name) not in table.original:
            canonical = _bare(name)  # the logger's prefix, not part of the framework's name
        elif canonical == name and (name in table.original or name in cache.values()):
            # our name, already taken by a translated one (or by a prefixed one stripped)
            canonical = f"{name} (as logged)"
            taken_by = table.original.get(name) or next(k for k, v in cache.items() if v == name)
            table.import_notes.append(f"{name} kept as {canonical!r}: {name} comes from "
                                      f"{taken_by}")
        elif canonical != name:
            if canonical in table.original or canonical in cache:
                canonical = name  # taken by another foreign name, or logged as such
            else:
                table.original[canonical] = name
                if note:
                    table.notes[canonical] = note
        cache[name] = canonical
        return canonical

    return rename


def _finish(table: MetricTable, framework: str | None) -> None:
    """After reading: give each canonical name to the framework's preferred foreign name (the
    first in its translation table that the file has), apply sign conventions, and note
    duplicated steps (`MetricTable.series` keeps the last value logged for a step)."""
    if framework:
        translations = TRANSLATIONS[framework]
        present = {_bare(n.removesuffix(" (as logged)")): n for n in table.names()
                   if n not in table.original}
        present |= {_bare(f): c for c, f in table.original.items()}
        for canonical, claimer in list(table.original.items()):
            preferred = next(f for f, t in translations.items() if t.canonical == canonical
                             and f in present)
            if preferred == _bare(claimer):
                continue
            stored = present[preferred]  # the preferred series, still under its own name
            table.move(canonical, claimer)
            table.move(stored, canonical)
            table.original[canonical] = stored.removesuffix(" (as logged)")
            table.notes[canonical] = translations[preferred].note
            table.import_notes[:] = [n for n in table.import_notes if repr(stored) not in n]
        for canonical, foreign in sorted(table.original.items()):
            t = translations[_bare(foreign)]
            if t.sign != 1.0 and table.has(canonical):
                table.scale(canonical, t.sign)
                table.import_notes.append(f"{foreign} is stored as {canonical} with its sign "
                                          "flipped (its convention is the opposite of ours)")
        shadowed = sorted(n for n in table.names() if n not in table.original.values()
                          and translate(framework, _bare(n))[0] != _bare(n))
        for name in shadowed:
            target = translate(framework, _bare(name))[0]
            table.import_notes.append(f"{name} kept under its own name: {target} comes from "
                                      f"{table.original.get(target, target)}")
    duplicated = table.duplicated_steps()
    if duplicated:
        steps = sorted({s for v in duplicated.values() for s in v})
        shown = ", ".join(f"{s:g}" for s in steps[:8]) + (", ..." if len(steps) > 8 else "")
        table.import_notes.append(
            f"{len(steps)} step(s) logged more than once ({shown}; {len(duplicated)} metric(s)): "
            "the last value logged for a step is used (a resumed or restarted run rewrites "
            "them)")


def guess_framework(names: list[str]) -> str | None:
    """The framework whose metric names these are: by characteristic prefixes, else the one
    with the most exact name matches (at least two; a ``train/`` prefix, as W&B shows TRL's
    and OpenRLHF's metrics, is ignored)."""
    bare = {_bare(n) for n in names}
    if bare and 2 * sum(map(is_registered, bare)) > len(bare):
        return None  # our own names (an rlscope run logged to TensorBoard or W&B)
    for framework, markers in FRAMEWORK_MARKERS.items():
        if any(n.startswith(markers) for n in bare):
            return framework
    counts = {fw: len(bare & set(table)) for fw, table in TRANSLATIONS.items()}
    best = max(counts, key=lambda fw: counts[fw])
    return best if counts[best] >= 2 else None


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
        except (json.JSONDecodeError, RecursionError) as e:
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
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
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
                table.config |= {"status": json.loads((path / extra).read_text())} \
                    if extra == "status.json" else json.loads((path / extra).read_text())
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                table.problem(None, f"{extra}: {e}")
    return table


def read_trl(path: Path) -> MetricTable:
    """A TRL ``trainer_state.json``: ``log_history`` entries keyed by ``step``; the final
    summary entry (``train_runtime``, ...) is kept under its own names."""
    try:
        state = json.loads(path.read_text(encoding="utf-8-sig"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
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
        step = entry.get("step")
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


def _first_line(text: str) -> str:
    stripped = text.lstrip()
    return stripped.splitlines()[0] if stripped else ""


def _tinker_jsonl(text: str) -> bool:
    """A JSON-lines file whose first object has tinker-cookbook's metric names."""
    if not text.lstrip().startswith("{"):
        return False
    try:
        keys = list(json.loads(_first_line(text)))
    except (json.JSONDecodeError, TypeError):
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


DIRECTORY_SIGNS: tuple[tuple[str, Callable[[Path], bool]], ...] = (
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
    head = path.open("rb").read(SNIFF_BYTES).removeprefix(b"\xef\xbb\xbf")
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


def _binary_share(data: bytes) -> float:
    """The share of the first 4 KB that is neither printable ASCII, whitespace, nor part of
    valid UTF-8 text: a log with a line of junk is text, a checkpoint is not."""
    sample = data[:4096]
    if not sample:
        return 0.0
    text = sample.decode("utf-8", errors="replace")
    odd = sum(ch == "\ufffd" or (ord(ch) < 32 and ch not in "\t\n\r\x1b") for ch in text)
    return odd / len(text)


def read_verl_log(path: Path) -> MetricTable:
    """A verl console log (`rlscope.doctor.verl`)."""
    table = MetricTable(source=path.name, fmt="verl")
    read_verl(_lines(path), table, _renamer(table, "verl"))
    return table


Reader = Callable[[Path], list[MetricTable]]
"""Reads one path into its tables (one per run); raises DoctorError when it cannot."""

READERS: dict[str, Reader] = {
    "run": lambda p: [read_run_dir(p)],
    "verl": lambda p: [read_verl_log(p)],
    "trl": lambda p: [read_trl(p)],
    "wandb": lambda p: read_csv(p, "wandb"),
    "tinker": lambda p: [read_jsonl(p, "tinker", "tinker")],
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
    elif p.is_file() and not p.open("rb").read(SNIFF_BYTES).removeprefix(
            b"\xef\xbb\xbf").strip():
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
