"""`build_report`: read a run or sweep directory, write its figures and its HTML report.

The steps, each in its own module: `load` reads the directory into tidy rows and run records;
`tidy` aggregates the rows (mean ± SEM curves, final values); `figures` draws one PNG + SVG per
metric into ``<dir>/figures/``; the doctor diagnoses each run directory; `html` renders the
page. No torch import anywhere on this path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rlscope.doctor.diagnosis import Diagnosis, run_doctor
from rlscope.doctor.importers import DoctorError
from rlscope.report.figures import FigureFiles, name_colors, write_figures
from rlscope.report.html import render
from rlscope.report.load import ReportInput, load
from rlscope.report.tidy import ReportError, curves

DEFAULT_METRICS = ("eval/test_error", "eval/entropy", "reward/mean", "policy/entropy")


@dataclass(frozen=True)
class Report:
    """What `build_report` wrote."""

    html: Path
    figures: list[FigureFiles]
    input: ReportInput


def diagnose_runs(inp: ReportInput) -> dict[str, list[Diagnosis] | str]:
    """Run id → the doctor's diagnoses of its directory, or the reason it could not run."""
    out: dict[str, list[Diagnosis] | str] = {}
    for r in inp.runs:
        if r.run_dir is None:
            continue
        try:
            out[r.run] = run_doctor(r.run_dir)
        except (DoctorError, OSError) as e:
            out[r.run] = str(e)
    return out


def sweep_band(path: Path) -> str:
    """The ribbon a sweep's manifest asks for (``[sweep] band`` in ``<path>/manifest.toml``:
    ``sem`` or ``std``); ``sem`` for a run directory or a manifest without it."""
    import tomllib

    try:
        band = tomllib.loads((path / "manifest.toml").read_text(encoding="utf-8")).get(
            "sweep", {}).get("band", "sem")
    except (OSError, ValueError, AttributeError):
        return "sem"
    return band if band in ("sem", "std") else "sem"


def build_report(path: str | Path, out: str | Path | None = None,
                 metrics: Sequence[str] = DEFAULT_METRICS, samples: int = 6,
                 doctor: bool = True, band: str | None = None) -> Report:
    """Write ``<path>/figures/<metric>.png|svg`` and the report (default
    ``<path>/report.html``) for a run directory or a sweep directory; the figures' ribbons are
    mean ± ``band`` (``sem`` or ``std``; None = the sweep manifest's `sweep_band`)."""
    if not metrics:
        raise ReportError("metrics is empty: name at least one metric to plot")
    metrics = list(dict.fromkeys(metrics))
    inp = load(path, metrics)
    styles = name_colors(inp.names)
    figures = write_figures({m: curves(inp.rows, m) for m in metrics}, styles,
                            inp.path / "figures",
                            band=sweep_band(inp.path) if band is None else band)
    diagnoses = diagnose_runs(inp) if doctor else {}
    target = Path(out) if out else inp.path / "report.html"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render(inp, metrics, figures, styles, diagnoses, samples),
                      encoding="utf-8")
    return Report(html=target, figures=figures, input=inp)
