"""`rlscope sweep --builtin companions_smoke` (COMPANIONS.md §6): every companion's step kind
trains two steps, evaluates after each and lands in the sweep's results."""

from __future__ import annotations

import csv
from importlib.resources import files
from pathlib import Path

import pytest

from rlscope.cli import main
from rlscope.sweep.manifest import parse_manifest

SMOKE_RUNS = {"opd", "vpo", "pedagogy", "learnability", "rlm"}
"""The smoke manifest's runs: one per companion family."""


def test_the_smoke_manifest_has_one_run_per_companion_with_two_steps(tmp_path: Path) -> None:
    text = (files("rlscope.sweep") / "builtin" / "companions_smoke.toml").read_text()
    manifest = parse_manifest(text, "companions_smoke.toml", tmp_path)
    runs = {spec.id: spec for spec in manifest.runs}
    assert [spec.seed for spec in manifest.runs] == [0] * len(runs)
    assert set(runs) == SMOKE_RUNS
    assert all(spec.config.run.num_steps == 2 and spec.config.run.eval_every == 1
               for spec in runs.values())


@pytest.mark.slow
def test_the_smoke_sweep_writes_every_runs_evaluations(tmp_path: Path) -> None:
    out = tmp_path / "smoke"
    assert main(["sweep", "--builtin", "companions_smoke", "--output", str(out),
                 "--threads", "1", "--no_report"]) == 0
    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    names = {row["name"] for row in rows}
    assert names == SMOKE_RUNS
    steps = {(row["name"], int(float(row["step"]))) for row in rows}
    for name in names:  # evaluations before steps 0 and 1 and after the last
        assert {(name, 0), (name, 1), (name, 2)} <= steps


@pytest.mark.slow
def test_the_smoke_probe_line_writes_its_csv_and_summary(tmp_path: Path) -> None:
    out = tmp_path / "opd_variance"
    assert main(["probe", "opd_variance", "--horizons", "4", "8", "--num_batches", "4",
                 "--num_seeds", "1", "--out_dir", str(out)]) == 0
    with (out / "opd_variance.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 3  # two horizons × the three estimators, one seed
    assert (out / "summary.md").read_text().strip()
