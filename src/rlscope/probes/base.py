"""What every probe shares (COMPANIONS.md §0, ``rlscope probe NAME``): the registry record,
the result, the writer of ``<name>.csv`` and ``summary.md``, and the small statistics the
summaries report.

A probe is a measurement that is not a training run. Its options are a frozen dataclass parsed by
tyro (``rlscope probe NAME --help``); ``run(cfg)`` returns a `ProbeResult`: one CSV row per seed
and setting, and the Markdown summary (seed means, fitted slopes).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

Row = dict[str, float | int | str]


@dataclass(frozen=True)
class ProbeResult:
    """A probe's measurements: ``rows`` (one per seed and setting) and ``summary`` (Markdown)."""

    rows: list[Row]
    summary: str


class ProbeOptions(Protocol):
    """What every probe's options class has: the directory its outputs go to."""

    @property
    def out_dir(self) -> str: ...


@dataclass(frozen=True)
class ProbeSpec:
    """A registered probe: its options class, its run function and one line of description."""

    config: type
    run: Callable[[Any], ProbeResult]
    description: str


def write_result(result: ProbeResult, name: str, out_dir: Path) -> tuple[Path, Path]:
    """Write ``<out_dir>/<name>.csv`` (columns: the union of the rows' keys, in first-seen
    order) and ``<out_dir>/summary.md``; returns both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    columns: list[str] = []
    for row in result.rows:
        columns += [k for k in row if k not in columns]
    csv_path = out_dir / f"{name}.csv"
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(result.rows)
    summary_path = out_dir / "summary.md"
    summary_path.write_text(result.summary)
    return csv_path, summary_path


def mean(values: Sequence[float]) -> float:
    """Arithmetic mean (NaN when empty)."""
    return sum(values) / len(values) if values else math.nan


def geometric_mean(values: Sequence[float]) -> float:
    """exp(mean log x) over the positive values (NaN when none)."""
    logs = [math.log(v) for v in values if v > 0]
    return math.exp(mean(logs)) if logs else math.nan


def loglog_slope(x: Sequence[float], y: Sequence[float]) -> float:
    """Least-squares slope of log y on log x over the pairs with both positive (NaN with fewer
    than two such pairs or no spread in x)."""
    pairs = [(math.log(a), math.log(b)) for a, b in zip(x, y, strict=True) if a > 0 and b > 0]
    if len(pairs) < 2:
        return math.nan
    mx = mean([a for a, _ in pairs])
    my = mean([b for _, b in pairs])
    sxx = sum((a - mx) ** 2 for a, _ in pairs)
    if sxx == 0:
        return math.nan
    return sum((a - mx) * (b - my) for a, b in pairs) / sxx


def parse_ints(text: str, option: str) -> list[int]:
    """A comma-separated list of integers (``--group_sizes 4,8,16``); ValueError naming the
    option otherwise."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{option}={text!r}: give comma-separated integers, e.g. 4,8,16") \
            from None
    if not values:
        raise ValueError(f"{option} is empty: give comma-separated integers, e.g. 4,8,16")
    return values


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table; floats with 4 significant digits."""
    def cell(v: object) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
