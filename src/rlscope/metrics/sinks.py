"""Where metrics go: the run directory's JSONL files, the tidy CSV, and the live console.

Run directory (ARCHITECTURE.md): ``config.json``, ``metrics.jsonl`` (one object per optimizer
step), ``eval.jsonl`` (one per evaluation), ``samples.jsonl`` (a few decoded rollouts per logged
step) and ``checkpoints/``. Every file is flushed after each write, so a crash loses nothing
already logged.
"""

from __future__ import annotations

import csv
import fcntl
import io
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from rlscope.results import iter_jsonl as iter_jsonl  # re-exported: its home is the results layer

SHOWN = {"reward/mean": "r", "policy/entropy": "H", "adv/abs_mean": "|A|",
         "policy/clipfrac_region": "clip", "optim/grad_norm": "gn"}


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class JsonlWriter:
    """Append-only JSON lines, flushed per record."""

    def __init__(self, path: Path, append: bool) -> None:
        self.path = path
        self._f = path.open("a" if append else "w", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self._f.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def append_csv_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """Append tidy rows under an exclusive lock (several seed workers share one file).

    The header is written when the file is new and widened when a row brings a new column
    (the file is rewritten then, keeping every earlier row).
    """
    if not rows:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+", newline="", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        reader = csv.DictReader(f)
        fields = list(reader.fieldnames or [])
        existing = list(reader)
        new_fields = list(dict.fromkeys(k for row in rows for k in row if k not in fields))
        if new_fields or not fields:
            f.seek(0)
            f.truncate()
            writer = csv.DictWriter(f, fieldnames=fields + new_fields)
            writer.writeheader()
            writer.writerows(existing)
        else:
            writer = csv.DictWriter(f, fieldnames=fields)
        writer.writerows(rows)
        f.flush()


def _replace_text(path: Path, text: str) -> None:
    """Rewrite ``path`` atomically (temporary file, fsync, rename)."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8", newline="") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def truncate_jsonl(path: Path, step: int) -> list[str]:
    """Keep the records of a JSONL log logged before ``step`` (a resumed run writes the rest
    again) and drop a line cut off by a kill; returns notices of what was dropped.

    A record without a ``step`` is kept. A line that is not a JSON object (the cut-off last
    line of a killed write, or damage) is dropped with a notice naming its line number."""
    if not path.exists():
        return []
    kept: list[str] = []
    notices: list[str] = []
    later = 0
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if not isinstance(record, dict):
            cut = number == len(lines)  # no newline after it: the write was cut off
            notices.append(f"{path}: dropped {'the cut-off last line' if cut else 'malformed line'}"
                           f" {number} ({len(line)} characters)")
            continue
        if "step" in record and int(record["step"]) >= step:
            later += 1
            continue
        kept.append(line + "\n")
    if later:
        notices.append(f"{path}: dropped {later} records of step {step} and later (written "
                       "after the checkpoint; the resumed run writes them again)")
    if notices or not text.endswith("\n"):  # also end a complete but unterminated last line
        _replace_text(path, "".join(kept))
    return notices


def truncate_csv_rows(path: Path, run: str, step: int) -> list[str]:
    """Drop the `append_csv_rows` rows of run ``run`` at ``step`` or later, and a cut-off last
    row, under the file's lock (other runs' rows stay); returns notices of what was dropped."""
    if not path.exists():
        return []
    notices: list[str] = []
    with path.open("r+", newline="", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        text = f.read()
        if text and not text.endswith("\n"):
            cut = text.rsplit("\n", 1)
            text = cut[0] + "\n" if len(cut) == 2 else ""
            notices.append(f"{path}: dropped the cut-off last row ({len(cut[-1])} characters)")
        reader = csv.DictReader(io.StringIO(text))
        fields = list(reader.fieldnames or [])
        rows = list(reader)
        kept = [row for row in rows
                if not (row.get("run") == run and _step_at_least(row.get("step"), step))]
        if len(kept) < len(rows):
            notices.append(f"{path}: dropped {len(rows) - len(kept)} rows of run {run} at step "
                           f"{step} and later (the resumed run writes them again)")
        if notices:
            out = io.StringIO()
            if fields:
                writer = csv.DictWriter(out, fieldnames=fields)
                writer.writeheader()
                writer.writerows(kept)
            f.seek(0)
            f.truncate()
            f.write(out.getvalue())
            f.flush()
            os.fsync(f.fileno())
    return notices


def _step_at_least(value: str | None, step: int) -> bool:
    try:
        return value is not None and float(value) >= step
    except ValueError:
        return False


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def compact_line(metrics: dict[str, float], last_eval: dict[str, float]) -> str:
    """One short line of the step's key metrics and the last evaluation's error."""
    parts = [f"{short} {metrics[k]:.2g}" for k, short in SHOWN.items() if k in metrics]
    if "time/step" in metrics:
        parts.append(f"{metrics['time/step'] * 1e3:.0f} ms/step")
    if "eval/test_error" in last_eval:
        parts.append(f"test err {last_eval['eval/test_error']:.3f}")
    return "  ".join(parts)


class LiveDisplay:
    """A rich progress bar with a compact metrics line under it; a no-op when disabled."""

    def __init__(self, enabled: bool, total: int, title: str, start: int = 0) -> None:
        self.enabled = enabled
        self.last_eval: dict[str, float] = {}
        if not enabled:
            return
        console = Console(stderr=True)
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(bar_width=30),
            MofNCompleteColumn(), TimeElapsedColumn(), console=console)
        self.task = self.progress.add_task(title, total=total, completed=start)
        self.line = Text("", style="dim", no_wrap=True, overflow="ellipsis")
        self.console = console
        self.live = Live(Group(self.progress, self.line), console=console,
                         refresh_per_second=8)
        self.live.start()

    def update(self, metrics: dict[str, float]) -> None:
        if self.enabled:
            self.progress.update(self.task, advance=1)
            self.line.plain = compact_line(metrics, self.last_eval)

    def eval(self, metrics: dict[str, float]) -> None:
        self.last_eval = metrics

    def alert(self, text: str) -> None:
        """A line on standard error (above the progress bar when it shows): the doctor's
        alerts, printed whether or not the progress display is on."""
        if self.enabled:
            self.console.print(f"[yellow]{text}[/yellow]", highlight=False)
        else:
            sys.stderr.write(text + "\n")

    def close(self) -> None:
        if self.enabled:
            self.live.stop()
            if not self.console.is_terminal:  # a terminal's cursor already moved past it
                self.console.line()


LOG_TARGETS = ("tensorboard", "wandb")
"""Where `rlscope train --log_to` can also write the metrics (metrics.jsonl is always written)."""
_LOG_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}


def parse_log_to(value: str) -> tuple[str, ...]:
    """``"tensorboard,wandb"`` → the targets; ``"none"`` or ``""`` → none. ValueError names an
    unknown target or a target whose package is not installed (before any work starts)."""
    targets = tuple(dict.fromkeys(t.strip().lower() for t in value.split(",") if t.strip()))
    if targets in ((), ("none",)):
        return ()
    unknown = [t for t in targets if t not in LOG_TARGETS]
    if unknown:
        raise ValueError(f"--log_to {value!r}: unknown target(s) {', '.join(unknown)}; use "
                         f"'none' or a comma-separated list of {', '.join(LOG_TARGETS)}")
    import importlib.util

    missing = [t for t in targets if importlib.util.find_spec(_LOG_PACKAGES[t]) is None]
    if missing:
        raise ValueError(f"--log_to {', '.join(missing)} needs the {', '.join(missing)} "
                         "package: install rlscope[logging] (pip install 'rlscope[logging]')")
    return targets


def wandb_mode(environ: dict[str, str]) -> str | None:
    """``"offline"`` unless the user configured W&B: a ``WANDB_MODE`` (respected as set), a
    ``WANDB_API_KEY``, or a login stored in ~/.netrc for api.wandb.ai. None = let W&B decide."""
    if environ.get("WANDB_MODE") or environ.get("WANDB_API_KEY"):
        return None
    import netrc

    try:
        logged_in = netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        logged_in = False
    return None if logged_in else "offline"


def _scalars(record: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in record.items() if k != "step"
            and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


class ScalarSinks:
    """TensorBoard and W&B writers for the canonical metric names, one record per step.

    TensorBoard event files go to ``<run_dir>/tensorboard/`` (``torch.utils.tensorboard``);
    W&B writes ``<run_dir>/wandb/`` (offline unless configured, see `wandb_mode`), project
    ``rlscope``, the run named after the run directory, the run's config as W&B config.
    Both packages are imported only when asked for.
    """

    def __init__(self, targets: tuple[str, ...], run_dir: Path, run_name: str,
                 config: dict[str, Any]) -> None:
        import os

        self._tb: Any = None
        self._wandb: Any = None
        if "tensorboard" in targets:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
        if "wandb" in targets:
            import wandb

            self._wandb = wandb.init(project=os.environ.get("WANDB_PROJECT", "rlscope"),
                                     name=run_name, dir=str(run_dir), config=config,
                                     mode=wandb_mode(dict(os.environ)))  # type: ignore[arg-type]

    def log(self, record: dict[str, Any]) -> None:
        """One metrics.jsonl or eval.jsonl record (its ``step`` is the x axis)."""
        values = _scalars(record)
        if not values:
            return
        step = int(record["step"])
        if self._tb is not None:
            for name, value in values.items():
                self._tb.add_scalar(name, value, step)
        if self._wandb is not None:
            self._wandb.log(values, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            sync_file = getattr(self._wandb.settings, "sync_file", None)
            self._wandb.finish()
            self._wandb = None
            if sync_file:  # W&B writes the run file in the background: return once it is whole
                from rlscope.metrics.wandb_log import wait_for_wandb

                wait_for_wandb(Path(sync_file))
