"""Static figures of full trajectories: one figure (one panel) per metric, PNG and SVG.

Each figure draws, for every name, the mean across its runs as a line and the mean ± SEM as a
translucent band (`tidy.curves`); a single run has no band. Colours are assigned once per
report by `name_colors` — a fixed colour-blind-safe palette (Okabe & Ito 2008) indexed by the
sorted names — and passed to every figure and table, so a name has one colour everywhere.

Figures are built with ``matplotlib.figure.Figure`` and rendered by the Agg / SVG canvases
directly: pyplot is never imported, so no global figure state is created or leaked, and the
caller's matplotlib backend is left alone. SVG output draws text as paths (no font files) and
uses a fixed hash salt and no date, so the same data gives the same file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from rlscope.report.tidy import Curve

PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000",
           "#F0E442")
"""Okabe–Ito colours; blue first. After eight names the colours repeat with a new dash."""
LINESTYLES = ("-", "--", ":", "-.")
BAND_ALPHA = 0.2
MARKER_MAX_POINTS = 30
"""Curves with at most this many points (evaluations) also mark each point."""


@dataclass(frozen=True)
class Style:
    """How one name is drawn in every figure (and marked in the tables)."""

    color: str
    linestyle: str


@dataclass(frozen=True)
class FigureFiles:
    """The files written for one metric."""

    metric: str
    png: Path
    svg: Path


def name_colors(names: list[str]) -> dict[str, Style]:
    """A style per name, by position in the sorted names: the same set of names always gets
    the same colours, whatever order they were found in."""
    out = {}
    for i, name in enumerate(sorted(set(names))):
        out[name] = Style(color=PALETTE[i % len(PALETTE)],
                          linestyle=LINESTYLES[(i // len(PALETTE)) % len(LINESTYLES)])
    return out


def slug(metric: str) -> str:
    """A file name for a metric: ``eval/test_error`` → ``eval-test_error``."""
    return re.sub(r"[^A-Za-z0-9_.]+", "-", metric).strip("-.") or "metric"


def legend_label(curve: Curve) -> str:
    """The legend text of a curve (the name and how many runs it averages)."""
    return f"{curve.name} ({curve.n_runs} runs)" if curve.n_runs != 1 else f"{curve.name} (1 run)"


def _band_S(c: Curve, band: str) -> np.ndarray:
    """The half-width of a curve's ribbon: its SEM, or its sd for ``band="std"``."""
    if band == "std" and c.sd_S is not None:
        return c.sd_S
    return c.sem_S


def plot_metric(metric: str, curves: dict[str, Curve], styles: dict[str, Style],
                band: str = "sem") -> Figure:
    """One panel: each name's mean line and, where at least two runs logged a step, its
    mean ± SEM band (``band="std"``: mean ± sd across seeds). Legend entries carry the number
    of runs behind the line."""
    fig = Figure(figsize=(6.4, 4.0), layout="constrained")
    ax = fig.subplots()
    for name, c in curves.items():
        style = styles[name]
        marker = "o" if len(c.steps_S) <= MARKER_MAX_POINTS else None
        ax.plot(c.steps_S, c.mean_S, color=style.color, linestyle=style.linestyle,
                marker=marker, markersize=3, linewidth=1.5, label=legend_label(c))
        err_S = _band_S(c, band)
        has_band = np.isfinite(err_S)
        if has_band.any():
            ax.fill_between(c.steps_S, c.mean_S - err_S, c.mean_S + err_S, where=has_band,
                            color=style.color, alpha=BAND_ALPHA, linewidth=0)
    ax.set_xlabel("step")
    ax.set_ylabel(metric)
    banded = any(np.isfinite(_band_S(c, band)).any() for c in curves.values())
    label = "SD" if band == "std" else "SEM"
    ax.set_title(f"{metric}: mean ± {label} across seeds" if banded else metric, fontsize=10)
    ax.grid(True, alpha=0.3, linewidth=0.5)
    if curves:
        ax.legend(fontsize=8, loc="best", frameon=False)
    return fig


def write_figures(curves_by_metric: dict[str, dict[str, Curve]], styles: dict[str, Style],
                  out_dir: Path, dpi: int = 120, band: str = "sem") -> list[FigureFiles]:
    """``out_dir/<slug>.png`` and ``.svg`` for every metric with at least one curve, in the
    order given (``band``: see `plot_metric`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for metric, curves in curves_by_metric.items():
        if not curves:
            continue
        fig = plot_metric(metric, curves, styles, band)
        png, svg = out_dir / f"{slug(metric)}.png", out_dir / f"{slug(metric)}.svg"
        fig.savefig(png, dpi=dpi, metadata={"Software": None})
        with matplotlib.rc_context({"svg.fonttype": "path", "svg.hashsalt": "rlscope"}):
            fig.savefig(svg, metadata={"Date": None})
        written.append(FigureFiles(metric=metric, png=png, svg=svg))
    return written


__all__ = ["PALETTE", "FigureFiles", "Style", "legend_label", "name_colors", "plot_metric",
           "slug", "write_figures"]
