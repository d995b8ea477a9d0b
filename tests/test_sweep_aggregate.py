"""Sweep aggregation (`rlscope.sweep.aggregate`): hand-computed means, sample sds, standard
errors and first crossings on a small hand-made table; tidy rows from run directories; the
files written; no torch import."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from rlscope.sweep.aggregate import (
    CrossingSpec,
    TidyRow,
    aggregate,
    crossings,
    curves,
    final_markdown,
    final_table,
    load_tidy,
    mean_sd,
    sem,
    tidy,
    write_tidy,
)

# eval/test_error of two names:
#   a (grpo):  seed 0: step 0 → 0.5, 10 → 0.2, 20 → 0.0
#              seed 1: step 0 → 0.6, 10 → 0.0, 20 → 0.0
#              seed 2: step 0 → 0.4, 10 → 0.3             (stopped early: no step 20)
#   b (dg):    seed 0: step 0 → 0.5, 10 → 0.1
TABLE = {
    ("a", "grpo", 0): {0: 0.5, 10: 0.2, 20: 0.0},
    ("a", "grpo", 1): {0: 0.6, 10: 0.0, 20: 0.0},
    ("a", "grpo", 2): {0: 0.4, 10: 0.3},
    ("b", "dg", 0): {0: 0.5, 10: 0.1},
}


def _rows() -> list[TidyRow]:
    rows = []
    for (name, method, seed), values in TABLE.items():
        for step, value in values.items():
            rows.append(TidyRow(f"{name}_s{seed}", name, method, seed, "eval", step,
                                "eval/test_error", value))
            rows.append(TidyRow(f"{name}_s{seed}", name, method, seed, "eval", step,
                                "time/eval", 0.01))
            rows.append(TidyRow(f"{name}_s{seed}", name, method, seed, "train", step,
                                "reward/mean", 1.0 - value))
    return rows


def test_mean_sd_and_sem_by_hand() -> None:
    # 1, 2, 3, 4: mean 2.5, squared deviations 2.25 + 0.25 + 0.25 + 2.25 = 5, /3 → sd √(5/3)
    mean, sd = mean_sd([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5 and sd == pytest.approx(math.sqrt(5 / 3))
    assert sem([1.0, 2.0, 3.0, 4.0]) == pytest.approx(math.sqrt(5 / 3) / 2)
    one = mean_sd([7.0])
    assert one[0] == 7.0 and math.isnan(one[1]) and math.isnan(sem([7.0]))
    assert all(math.isnan(v) for v in mean_sd([]))


def test_final_table_by_hand() -> None:
    cells = final_table(_rows())
    # the default: every evaluation metric except timings
    assert [(c.name, c.metric) for c in cells] == [("a", "eval/test_error"),
                                                  ("b", "eval/test_error")]
    a, b = cells
    # a's last values: seed 0 at step 20 → 0.0, seed 1 at 20 → 0.0, seed 2 at 10 → 0.3
    assert a.seeds == (0, 1, 2) and a.values == (0.0, 0.0, 0.3) and a.steps == (20, 20, 10)
    # mean 0.1; deviations −0.1, −0.1, 0.2 → squares 0.01 + 0.01 + 0.04 = 0.06, /(3−1) = 0.03
    assert a.mean == pytest.approx(0.1) and a.sd == pytest.approx(math.sqrt(0.03)) and a.n == 3
    assert a.method == "grpo"
    # a single seed: the mean is its value, the sample sd is undefined
    assert b.mean == 0.1 and math.isnan(b.sd) and b.n == 1 and b.method == "dg"
    table = final_markdown(cells)
    assert "| a | grpo | 0.1 ± 0.1732 (3) |" in table
    assert "| b | dg | 0.1 ± nan (1) |" in table
    assert "sample standard deviation across seeds (ddof = 1; nan when n = 1)" in table
    train = final_table(_rows(), ["reward/mean"])
    # a train metric: its last logged step per seed: 1 − (0.0, 0.0, 0.3) → mean 0.9
    assert train[0].mean == pytest.approx(0.9) and train[0].values == (1.0, 1.0, 0.7)


def test_crossings_by_hand() -> None:
    a, b = crossings(_rows(), "eval/test_error", 0.0, "<=")
    # a: seed 0 first at 0.0 on step 20, seed 1 on step 10, seed 2 never
    assert a.steps == ((0, 20), (1, 10), (2, None))
    # mean (20 + 10) / 2 = 15; deviations ±5 → (25 + 25) / (2 − 1) = 50 → sd √50
    assert a.mean_step == 15.0 and a.sd_step == pytest.approx(math.sqrt(50))
    assert (a.n_crossed, a.n_seeds) == (2, 3)
    assert b.steps == ((0, None),) and (b.n_crossed, b.n_seeds) == (0, 1)
    assert math.isnan(b.mean_step) and math.isnan(b.sd_step)
    up = crossings(_rows(), "eval/test_error", 0.5, ">=")[0]
    # ≥ 0.5: seeds 0 (0.5) and 1 (0.6) at step 0, seed 2 (0.4, 0.3) never
    assert up.steps == ((0, 0), (1, 0), (2, None)) and up.mean_step == 0.0 and up.sd_step == 0.0
    with pytest.raises(ValueError, match="direction"):
        crossings(_rows(), "eval/test_error", 0.0, "<")  # type: ignore[arg-type]


def test_curves_by_hand() -> None:
    points = curves(_rows(), "eval/test_error")
    by = {(p.name, p.step): p for p in points}
    assert [(p.name, p.step) for p in points] == [("a", 0), ("a", 10), ("a", 20), ("b", 0),
                                                  ("b", 10)]
    # a, step 0: 0.5, 0.6, 0.4 → mean 0.5, sd √((0 + 0.01 + 0.01) / 2) = 0.1, SEM 0.1/√3
    p = by["a", 0]
    assert p.mean == pytest.approx(0.5) and p.sem == pytest.approx(0.1 / math.sqrt(3))
    assert p.n == 3 and p.kind == "eval" and p.method == "grpo"
    # a, step 10: 0.2, 0.0, 0.3 → mean 0.5/3; squared deviations
    # (0.2 − 1/6)² + (1/6)² + (0.3 − 1/6)² = 0.0011 + 0.0278 + 0.0178 = 0.04667, /2 → sd 0.15275
    p = by["a", 10]
    assert p.mean == pytest.approx(0.5 / 3)
    assert p.sem == pytest.approx(math.sqrt(0.14 / 3 / 2) / math.sqrt(3))
    # a, step 20: only seeds 0 and 1 logged it → n = 2, both 0.0
    assert (by["a", 20].mean, by["a", 20].sem, by["a", 20].n) == (0.0, 0.0, 2)
    # b has one seed: the SEM is undefined
    assert by["b", 0].mean == 0.5 and math.isnan(by["b", 0].sem) and by["b", 0].n == 1


def test_empty_tables_say_so() -> None:
    assert final_markdown([]).endswith("No run has logged these metrics yet.\n")


def test_a_repeated_step_keeps_the_last_value() -> None:
    rows = [*_rows(), TidyRow("a_s2", "a", "grpo", 2, "eval", 10, "eval/test_error", 0.6)]
    a = final_table(rows, ["eval/test_error"])[0]
    # seed 2's step 10 is now 0.6: values 0, 0, 0.6 → mean 0.2
    assert a.values == (0.0, 0.0, 0.6) and a.mean == pytest.approx(0.2)


def _fake_run(runs: Path, run: str, method: str, seed: int, metrics: list[dict[str, object]],
              evals: list[dict[str, object]]) -> None:
    d = runs / run
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"config": {"method": method,
                                                          "run": {"seed": seed}}}))
    (d / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    # a line cut off by a kill at the end is ignored
    (d / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals) + '{"step": 9')


def test_tidy_reads_run_directories(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    _fake_run(runs, "x-lr=0.1_s3", "grpo", 3,
              [{"step": 0, "reward/mean": 0.25, "loss/total": "nan"}],
              [{"step": 0, "eval/test_error": 1.0}, {"step": 1, "eval/test_error": 0.5}])
    (runs / "empty_s0").mkdir()  # a run that never started: no config.json, no rows
    rows = tidy(tmp_path)
    assert rows[0] == TidyRow("x-lr=0.1_s3", "x-lr=0.1", "grpo", 3, "train", 0, "reward/mean",
                              0.25)
    assert rows[1].metric == "loss/total" and math.isnan(rows[1].value)  # JSONL writes "nan"
    assert [(r.kind, r.step, r.value) for r in rows[2:]] == [("eval", 0, 1.0),
                                                             ("eval", 1, 0.5)]
    # sweep.json, when present, decides which runs count and their names
    (tmp_path / "sweep.json").write_text(json.dumps({"runs": [
        {"run": "x-lr=0.1_s3", "name": "renamed"}]}))
    assert {r.name for r in tidy(tmp_path)} == {"renamed"}


@pytest.mark.parametrize("parquet", [False, True])
def test_tidy_round_trip(tmp_path: Path, parquet: bool) -> None:
    rows = [*_rows(), TidyRow("c_s0", "c", "dg", 0, "train", 1, "loss/total", math.nan)]
    if parquet:
        pytest.importorskip("pyarrow")
    files, note = write_tidy(rows, tmp_path)
    back = load_tidy(tmp_path / ("results.parquet" if parquet else "results.csv"))
    assert back[:-1] == rows[:-1] and math.isnan(back[-1].value)
    assert files[0] == tmp_path / "results.csv"
    assert (note == "") == (len(files) == 2)


def test_without_pyarrow_csv_only_and_a_hint(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow raises ImportError
    files, note = write_tidy(_rows(), tmp_path)
    assert files == [tmp_path / "results.csv"] and not (tmp_path / "results.parquet").exists()
    assert "pip install pyarrow" in note


def test_aggregate_writes_every_file(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for seed, errors in ((0, [0.5, 0.0]), (1, [0.5, 0.25])):
        _fake_run(runs, f"grpo_s{seed}", "grpo", seed,
                  [{"step": 0, "reward/mean": 0.5}],
                  [{"step": s, "eval/test_error": e, "eval/entropy": 0.05, "time/eval": 0.1}
                   for s, e in zip((0, 5), errors, strict=True)])
    result = aggregate(tmp_path, crossing_specs=[CrossingSpec("eval/test_error", 0.0, "<=")])
    names = {p.name for p in result.files}
    assert {"results.csv", "final.csv", "final.md", "crossings.csv", "crossings.md",
            "curves.csv"} <= names
    assert result.rows == 2 * (1 + 2 * 3)
    # final test error: 0.0 and 0.25 → mean 0.125, sd √(2 · 0.125² / 1) = 0.1768
    cell = next(c for c in result.final if c.metric == "eval/test_error")
    assert cell.mean == 0.125 and cell.sd == pytest.approx(0.125 * math.sqrt(2))
    # zero error: seed 0 at step 5, seed 1 never
    assert "| grpo | grpo | 5 ± nan (1/2) |" in (tmp_path / "crossings.md").read_text()
    curve_lines = (tmp_path / "curves.csv").read_text().splitlines()
    assert curve_lines[0] == "name,method,kind,metric,step,mean,sem,n"
    assert "grpo,grpo,eval,eval/test_error,5,0.125,0.125,2" in curve_lines


def test_aggregate_imports_no_torch() -> None:
    code = "import sys, rlscope.sweep.aggregate; assert 'torch' not in sys.modules"
    src = Path(__file__).resolve().parents[1] / "src"
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONPATH": str(src)})


def test_mean_sd_of_seeds_diverging_both_ways_is_nan_not_an_error() -> None:
    """One seed at +inf and one at -inf: the mean is nan (it used to raise in math.fsum)."""
    mean, sd = mean_sd([math.inf, -math.inf])
    assert math.isnan(mean) and math.isnan(sd)
    assert mean_sd([math.inf, 1.0])[0] == math.inf
