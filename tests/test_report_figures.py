"""Report figures: the SEM band equals a hand computation, a single run has no band, one colour
per name across every figure, files written as PNG and SVG, and no pyplot or torch import."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from report_dirs import EVAL_STEPS, SEEDS, make_sweep, value

from rlscope.report.figures import PALETTE, name_colors, plot_metric, slug, write_figures
from rlscope.report.tidy import Curve, curves, read_results_csv

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _band_by_step(fig_axes_collection: object) -> dict[float, tuple[float, float]]:
    """step → (lowest, highest) y of the band polygon at that step."""
    ys: dict[float, list[float]] = defaultdict(list)
    for path in fig_axes_collection.get_paths():  # type: ignore[attr-defined]
        for x, y in path.vertices:
            ys[float(x)].append(float(y))
    return {x: (min(v), max(v)) for x, v in ys.items()}


def test_band_is_mean_plus_minus_sem_by_hand(tmp_path: Path) -> None:
    sweep = make_sweep(tmp_path / "sweep")
    metric = "eval/test_error"
    c = curves(read_results_csv(sweep / "results.csv", {metric}), metric)
    fig = plot_metric(metric, c, name_colors(list(c)))
    ax = fig.axes[0]
    assert len(ax.collections) == 2  # one band per name
    for collection, name in zip(ax.collections, sorted(c), strict=True):
        band = _band_by_step(collection)
        assert sorted(band) == list(EVAL_STEPS)
        for step in EVAL_STEPS:
            vals = [value(name, s, step, metric) for s in SEEDS]
            mean = sum(vals) / len(vals)
            se = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1) / len(vals))
            assert band[step] == pytest.approx((mean - se, mean + se), rel=1e-12)
    assert ax.get_xlabel() == "step" and ax.get_ylabel() == metric
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["alpha (3 runs)",
                                                                  "beta (3 runs)"]


def test_single_run_has_no_band() -> None:
    c = Curve("r", np.array([0.0, 1.0]), np.array([1.0, 2.0]), np.array([math.nan, math.nan]),
              np.array([1, 1]))
    ax = plot_metric("reward/mean", {"r": c}, name_colors(["r"])).axes[0]
    assert len(ax.collections) == 0 and len(ax.lines) == 1
    assert ax.get_title() == "reward/mean"
    assert ax.get_legend().get_texts()[0].get_text() == "r (1 run)"


def test_a_diverged_seed_leaves_a_gap_not_an_error(tmp_path: Path) -> None:
    c = Curve("r", np.array([0.0, 1.0, 2.0]), np.array([1.0, math.nan, math.inf]),
              np.array([0.1, math.nan, math.nan]), np.array([2, 2, 2]))
    files = write_figures({"m": {"r": c}}, name_colors(["r"]), tmp_path)
    assert files[0].png.read_bytes().startswith(PNG_MAGIC)


def test_colours_follow_sorted_names_in_every_figure(tmp_path: Path) -> None:
    styles = name_colors(["gamma", "alpha", "beta", "alpha"])
    assert [s.color for s in styles.values()] == list(PALETTE[:3])
    assert list(styles) == ["alpha", "beta", "gamma"]
    many = name_colors([f"n{i:02d}" for i in range(10)])
    assert many["n08"].color == many["n00"].color and many["n08"].linestyle != "-"

    sweep = make_sweep(tmp_path / "sweep")
    rows = read_results_csv(sweep / "results.csv")
    styles = name_colors(["beta", "alpha"])
    for metric in ("reward/mean", "eval/entropy"):
        ax = plot_metric(metric, curves(rows, metric), styles).axes[0]
        colours = {line.get_label().split()[0]: line.get_color() for line in ax.lines}
        assert colours == {"alpha": PALETTE[0], "beta": PALETTE[1]}


def test_write_figures_png_and_svg(tmp_path: Path) -> None:
    sweep = make_sweep(tmp_path / "sweep")
    rows = read_results_csv(sweep / "results.csv")
    by_metric = {m: curves(rows, m) for m in ("eval/test_error", "reward/mean", "not/logged")}
    files = write_figures(by_metric, name_colors(["alpha", "beta"]), sweep / "figures")
    assert [f.metric for f in files] == ["eval/test_error", "reward/mean"]
    assert files[0].png == sweep / "figures" / "eval-test_error.png"
    for f in files:
        assert f.png.read_bytes().startswith(PNG_MAGIC)
        svg = f.svg.read_text()
        assert "<svg" in svg and "<dc:date>" not in svg
        for ref in ('src="http', 'href="http', "url(http"):
            assert ref not in svg
    again = write_figures(by_metric, name_colors(["alpha", "beta"]), tmp_path / "again")
    assert again[0].svg.read_bytes() == files[0].svg.read_bytes()  # deterministic SVG
    assert slug("eval/test_error") == "eval-test_error" and slug("a b//c") == "a-b-c"


def test_report_imports_neither_pyplot_nor_torch(tmp_path: Path) -> None:
    sweep = make_sweep(tmp_path / "sweep")
    code = ("import sys; from rlscope.report.build import build_report; "
            f"build_report({str(sweep)!r}); "
            "bad = [m for m in ('matplotlib.pyplot', 'torch') if m in sys.modules]; "
            "assert not bad, bad")
    src = Path(__file__).resolve().parents[1] / "src"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"},
                         check=False)
    assert out.returncode == 0, out.stderr
