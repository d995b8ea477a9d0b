"""`rlscope.results`: the one results layer under the sweep's tables, the report and the doctor."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rlscope import results
from rlscope.doctor import formats
from rlscope.metrics import sinks
from rlscope.report import tidy
from rlscope.results import TidyRow, curves, final_values, finite, index, number, read_run_dir
from rlscope.sweep import aggregate


def test_one_copy_shared_by_sweep_report_and_doctor() -> None:
    assert aggregate.TidyRow is tidy.TidyRow is TidyRow
    assert tidy.curves is curves and tidy.final_values is final_values
    assert tidy.rows_from_run_dir is read_run_dir and tidy.number is number
    assert aggregate.mean_sd is results.mean_sd and aggregate.sem is tidy.sem is results.sem
    assert formats._number is number and sinks.iter_jsonl is results.iter_jsonl


def test_results_imports_nothing_of_rlscope_and_the_report_not_the_sweep() -> None:
    code = ("import sys, rlscope.results; "
            "own = {m for m in sys.modules if m.startswith('rlscope.')}; "
            "assert own == {'rlscope.results'}, own; "
            "import rlscope.report.tidy; "
            "bad = {'torch', 'matplotlib', 'rlscope.sweep'} & set(sys.modules); "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(("raw", "expected"), [
    (1, 1.0), (True, 1.0), (False, 0.0), ("0.5", 0.5), ("-inf", -math.inf),
    ("text", None), (None, None), ([1], None)])
def test_number(raw: object, expected: float | None) -> None:
    assert number(raw) == expected


def test_number_keeps_nan_and_finite_drops_it() -> None:
    assert math.isnan(number("nan") or 0.0)
    assert finite("nan") is None and finite("inf") is None and finite("3") == 3.0


def test_run_dir_rows_skip_records_without_a_step(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text(
        json.dumps({"reward/mean": 1.0}) + "\n"            # no step: skipped
        + json.dumps({"step": "nan", "reward/mean": 2.0}) + "\n"  # no finite step: skipped
        + json.dumps({"step": 3, "reward/mean": 0.5, "note": "x"}) + "\n")
    rows = read_run_dir(tmp_path, "r_s1", "r", "grpo", 1)
    assert rows == [TidyRow("r_s1", "r", "grpo", 1, "train", 3, "reward/mean", 0.5)]


def test_index_keeps_the_last_value_of_a_repeated_step_and_orders_runs_by_seed() -> None:
    rows = [TidyRow("a_s2", "a", "grpo", 2, "eval", 0, "m", 1.0),
            TidyRow("a_s0", "a", "grpo", 0, "eval", 0, "m", 3.0),
            TidyRow("a_s0", "a", "grpo", 0, "eval", 5, "m", 4.0),
            TidyRow("a_s0", "a", "grpo", 0, "eval", 5, "m", 6.0)]  # a resumed leg re-logs 5
    series = index(rows)["m"]["a"]
    assert series.last_values() == [("a_s0", 5, 6.0), ("a_s2", 0, 1.0)]
    c = curves(rows, "m")["a"]
    np.testing.assert_array_equal(c.steps_S, [0, 5])
    np.testing.assert_allclose(c.mean_S, [2.0, 6.0])
    np.testing.assert_array_equal(c.n_S, [2, 1])
    assert final_values(rows, ["m"])["a"]["m"].text() == "3.5 ± 3.536 (2)"
