"""``rlscope report PATH``: options and the command itself (no torch is imported)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Annotated

import tyro

from rlscope.report.build import DEFAULT_METRICS, build_report
from rlscope.report.tidy import ReportError


@dataclass(frozen=True)
class ReportCommand:
    """Write a self-contained HTML report (opens offline) and PNG/SVG figures for a run
    directory or a sweep directory."""

    path: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="PATH")]
    """A run directory (runs/<name>/, with metrics.jsonl) or a sweep directory (with
    results.csv)."""
    out: str = ""
    """Where to write the HTML file; default PATH/report.html. Figures always go to
    PATH/figures/."""
    metrics: tuple[str, ...] = DEFAULT_METRICS
    """Metrics to plot (one figure each) and to list in the final table."""
    samples: int = 6
    """Sample rollouts shown per run (from the last logged step)."""
    doctor: bool = True
    """Run the doctor on every run directory and show its findings."""


def run(cmd: ReportCommand) -> int:
    """Write the report; 2 for an unusable input, 0 otherwise."""
    if cmd.samples < 0:
        sys.stderr.write(f"error: --samples must be >= 0, got {cmd.samples}\n")
        return 2
    try:
        report = build_report(cmd.path, cmd.out or None, cmd.metrics, cmd.samples, cmd.doctor)
    except ReportError as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    except OSError as e:
        sys.stderr.write(f"error: cannot read {cmd.path}: {e}\n")
        return 2
    figures = report.figures[0].png.parent if report.figures else "none"
    sys.stdout.write(f"wrote {report.html} ({len(report.figures)} figures in {figures})\n")
    return 0
