"""The report's aggregation: tidy rows from results.csv and run directories, mean ± SEM curves
and final values, checked against hand computations."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
from report_dirs import EVAL_STEPS, SEEDS, make_sweep, value

from rlscope.report.tidy import (
    RESULTS_COLUMNS,
    ReportError,
    TidyRow,
    curves,
    final_values,
    read_results_csv,
    rows_from_run_dir,
    sem,
)


def _row(run: str, name: str, step: float, v: float, metric: str = "m") -> TidyRow:
    return TidyRow(run=run, name=name, method="grpo", seed=0, kind="train", step=step,
                   metric=metric, value=v)


def test_sem_by_hand() -> None:
    # values 1, 2, 4: mean 7/3, s² = (16/9 + 1/9 + 25/9) / 2 = 7/3, SEM = √(7/3) / √3 = √7 / 3
    assert sem(np.array([1.0, 2.0, 4.0])) == pytest.approx(math.sqrt(7) / 3, rel=1e-12)
    assert math.isnan(sem(np.array([5.0])))


def test_curves_mean_and_sem_per_step_with_ragged_runs() -> None:
    rows = [_row("a_s0", "a", 0, 1.0), _row("a_s1", "a", 0, 2.0), _row("a_s2", "a", 0, 4.0),
            _row("a_s0", "a", 1, 3.0), _row("a_s1", "a", 1, 5.0),
            _row("a_s2", "a", 2, 7.0),  # only one run reached step 2
            _row("b_s0", "b", 0, 10.0), _row("a_s0", "a", 0, 99.0, metric="other")]
    c = curves(rows, "m")
    assert list(c) == ["a", "b"]
    a = c["a"]
    np.testing.assert_array_equal(a.steps_S, [0, 1, 2])
    np.testing.assert_allclose(a.mean_S, [7 / 3, 4.0, 7.0])
    np.testing.assert_allclose(a.sem_S[:2], [math.sqrt(7) / 3, 1.0])  # s = √2 for (3, 5)
    assert math.isnan(a.sem_S[2])
    np.testing.assert_array_equal(a.n_S, [3, 2, 1])
    assert a.n_runs == 3 and c["b"].n_runs == 1 and math.isnan(c["b"].sem_S[0])


def test_final_values_take_each_runs_last_step() -> None:
    rows = [_row("a_s0", "a", 0, 1.0), _row("a_s0", "a", 3, 2.0),
            _row("a_s1", "a", 0, 0.0), _row("a_s1", "a", 2, 6.0),
            _row("b_s0", "b", 1, 5.0)]
    f = final_values(rows, ["m", "absent"])
    assert list(f) == ["a", "b"]
    assert f["a"]["m"].mean == 4.0 and f["a"]["m"].n == 2
    assert f["a"]["m"].sd == pytest.approx(math.sqrt(8))  # (2, 6): s² = (4 + 4) / 1
    assert f["a"]["m"].text() == "4 ± 2.828 (2)"
    assert math.isnan(f["b"]["m"].sd) and f["b"]["m"].text() == "5 (1)"
    assert "absent" not in f["a"]


def test_results_csv_round_trip_and_hand_sem(tmp_path: Path) -> None:
    sweep = make_sweep(tmp_path / "sweep")
    rows = read_results_csv(sweep / "results.csv", {"eval/test_error"})
    assert {r.metric for r in rows} == {"eval/test_error"}
    assert len(rows) == 2 * len(SEEDS) * len(EVAL_STEPS)
    alpha = curves(rows, "eval/test_error")["alpha"]
    step = EVAL_STEPS[1]
    vals = [value("alpha", s, step, "eval/test_error") for s in SEEDS]
    mean = sum(vals) / len(vals)
    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
    assert alpha.mean_S[1] == pytest.approx(mean, rel=1e-12)
    assert alpha.sem_S[1] == pytest.approx(sd / math.sqrt(len(vals)), rel=1e-12)


def test_non_finite_values_are_kept_and_make_the_mean_nan(tmp_path: Path) -> None:
    good = tmp_path / "results.csv"
    with good.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(RESULTS_COLUMNS)
        w.writerow(["a_s0", "a", "grpo", "0", "eval", "0", "m", "nan"])
        w.writerow(["a_s0", "a", "grpo", "0", "eval", "1", "m", "inf"])
        w.writerow(["a_s0", "a", "grpo", "0", "eval", "2", "m", "0.5"])
        w.writerow(["a_s0", "a", "grpo", "0", "eval", "3", "m", "not a number"])
        w.writerow(["a_s1", "a", "grpo", "1", "eval", "1", "m", "0.25"])
        w.writerow(["a_s1", "a", "grpo", "1", "eval", "2", "m", "0.75"])
    rows = read_results_csv(good)
    assert [r.step for r in rows] == [0, 1, 2, 1, 2]
    c = curves(rows, "m")["a"]
    assert math.isnan(c.mean_S[0]) and c.mean_S[1] == math.inf and math.isnan(c.sem_S[1])
    assert c.mean_S[2] == 0.625  # a diverged step does not hide the steps after it
    diverged = final_values([*rows, _row("a_s1", "a", 3, math.nan, "m")], ["m"])["a"]["m"]
    assert math.isnan(diverged.mean) and diverged.n == 2 and diverged.text() == "nan (2)"
    bad = tmp_path / "bad.csv"
    bad.write_text("run,name,step,value\na,a,0,1\n")
    with pytest.raises(ReportError, match="missing column"):
        read_results_csv(bad)


def test_rows_from_run_dir_reads_train_and_eval(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text(
        json.dumps({"step": 0, "reward/mean": 0.5, "flag": True, "note": "text"}) + "\n"
        + "{partial line\n" + json.dumps({"step": 1, "reward/mean": "nan"}) + "\n")
    (run_dir / "eval.jsonl").write_text(json.dumps({"step": 1, "eval/test_error": 0.25}) + "\n")
    rows = rows_from_run_dir(run_dir, "r", "r", "grpo", 0)
    assert [(r.kind, r.step, r.metric) for r in rows] == [
        ("train", 0, "reward/mean"), ("train", 0, "flag"), ("train", 1, "reward/mean"),
        ("eval", 1, "eval/test_error")]
    assert [r.value for r in rows][:2] == [0.5, 1.0] and math.isnan(rows[2].value)
    assert len(rows_from_run_dir(run_dir, "r", "r", "grpo", 0, {"eval/test_error"})) == 1
