"""docs/evidence/companions/collect.py on a tiny synthetic sweep: hand-checked numbers."""

from __future__ import annotations

import importlib.util
import json
import math
import statistics
import sys
from pathlib import Path
from types import ModuleType

import pytest

COLLECT = Path(__file__).resolve().parents[1] / "docs" / "evidence" / "companions" / "collect.py"


@pytest.fixture(scope="module")
def collect() -> ModuleType:
    spec = importlib.util.spec_from_file_location("companions_collect", COLLECT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _run(root: Path, name: str, evals: list[dict], metrics: list[dict] | None = None) -> None:
    run = root / "runs" / name
    run.mkdir(parents=True)
    (run / "config.json").write_text("{}")
    (run / "status.json").write_text(json.dumps({"status": "completed"}))
    (run / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics or []))


def test_parse_config_reads_grid_values(collect: ModuleType) -> None:
    head, params = collect.parse_config("topk-teacher_temperature=0.5-opd_warmup_steps=100")
    assert head == "topk"
    assert params == {"teacher_temperature": "0.5", "opd_warmup_steps": "100"}


def test_stats_and_correlations_hand_values(collect: ModuleType) -> None:
    mean, sd, n = collect.stats([1.0, 2.0, 3.0, math.nan])
    assert (mean, sd, n) == (2.0, 1.0, 3)
    assert collect.fmt([1.0, 2.0, 3.0]) == "2 ± 1"
    assert collect.ranks([3.0, 1.0, 3.0]) == [2.5, 1.0, 2.5]
    assert collect.pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert collect.pearson([1, 2, 3], [1, 1, 1]) != collect.pearson([1, 2, 3], [1, 1, 1])  # nan
    # Monotone but not linear: Spearman 1, Pearson below 1.
    xs, ys = [1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 100.0]
    assert collect.spearman(xs, ys) == pytest.approx(1.0)
    assert collect.pearson(xs, ys) < 0.9
    assert collect.pearson(xs, ys) == pytest.approx(statistics.correlation(xs, ys))


def test_warmup_switch_row_and_final_minus_switch(collect: ModuleType, tmp_path: Path) -> None:
    sweep = tmp_path / "opd_topk_warmup"
    for seed, final in enumerate((0.2, 0.4)):
        _run(sweep, f"topk-opd_top_k=4-opd_warmup_steps=10_s{seed}", [
            {"step": 0, "eval/test_error": 0.9},
            {"step": 10, "eval/test_error": 0.6, "eval/top1_agreement": 0.5, "phase": "switch"},
            {"step": 20, "eval/test_error": final}])
    runs = collect.load_sweep(sweep)["topk-opd_top_k=4-opd_warmup_steps=10"]
    quantities = [collect.switch_quantities(r, 10) for r in runs]
    assert [q["eval/test_error"] for q in quantities] == [0.6, 0.6]
    assert [q["final_minus_switch"] for q in quantities] == pytest.approx([-0.4, -0.2])
    # W = 0 uses the step-0 row.
    assert collect.switch_quantities(runs[0], 0)["final_minus_switch"] == pytest.approx(-0.7)
    text = collect.opd_topk_warmup(collect.load_sweep(sweep))
    assert "| 4 | 10 | 2 |" in text and "-0.3 ± 0.14" in text


def test_learnability_gap_pairs_eval_with_same_step(collect: ModuleType, tmp_path: Path) -> None:
    sweep = tmp_path / "learnability"
    _run(sweep, "traj_group_pg-advantage=group_center_s0",
         [{"step": 0, "eval/success_probability": 0.1, "eval/predicted_mixed_group_rate": 0.5},
          {"step": 10, "eval/success_probability": 0.2, "eval/predicted_mixed_group_rate": 0.7}],
         [{"step": 0, "group/mixed_rate": 0.6}, {"step": 5, "group/mixed_rate": 0.0},
          {"step": 10, "group/mixed_rate": 0.65}])
    run = collect.load_sweep(sweep)["traj_group_pg-advantage=group_center"][0]
    assert collect.mixed_rate_gaps(run) == [(0, 0.1, 0.5, 0.6), (10, 0.2, 0.7, 0.65)]
    text = collect.learnability(collect.load_sweep(sweep))
    assert "+0.1000" in text  # largest |gap| is step 0's +0.1


def test_write_creates_summary_and_copies(collect: ModuleType, tmp_path: Path) -> None:
    sweep = tmp_path / "sweeps" / "opd_topk_stability"
    for name, errors in (("opd_reverse_kl_s0", (0.9, 0.1)), ("topk-opd_top_k=1_s0", (0.9, 0.85))):
        _run(sweep, name, [{"step": 0, "eval/test_error": errors[0]},
                           {"step": 20, "eval/test_error": errors[1]}])
    (sweep / "final.md").write_text("final table\n")
    (sweep / "curves.csv").write_text(
        "name,method,kind,metric,step,mean,sem,n\na,a,train,reward/mean,0,1,0,1\n"
        "a,a,eval,eval/test_error,0,0.9,0,1\n")
    out = tmp_path / "out"
    written = collect.write(tmp_path / "sweeps", out)
    assert written == [out / "opd_topk_stability" / "summary.md"]
    summary = written[0].read_text()
    assert "| opd_reverse_kl | 1 | 0.9 ± nan | 0.1 ± nan | -0.8 ± nan |" in summary
    assert "| 1/1 |" in summary and "| 0/1 |" in summary  # learned: 0.8 ≥ 0.1, 0.05 < 0.1
    assert (out / "opd_topk_stability" / "final.md").read_text() == "final table\n"
    curves = (out / "opd_topk_stability" / "curves_eval.csv").read_text().splitlines()
    assert len(curves) == 2 and curves[1].startswith("a,a,eval,")


def test_opd_variance_slopes_per_seed(collect: ModuleType) -> None:
    # Seed 0: Var = H² (slope 2); seed 1: Var = H (slope 1) → slope 1.5 ± 0.71.
    rows = [{"estimator": "token_pg", "seed": str(s), "horizon": str(h),
             "variance": str(float(h) ** (2 - s))} for s in (0, 1) for h in (4, 8, 16)]
    assert collect.loglog_slope([4.0, 8.0, 16.0], [16.0, 64.0, 256.0]) == pytest.approx(2.0)
    text = collect.opd_variance_slopes(rows)
    assert "| token_pg | 2 | 10 ± 8.5 | 36 ± 40 | 136 ± 1.7e+02 | 1.5 ± 0.71 |" in text


def test_drift_seed_slopes_fit_below_cutoff(collect: ModuleType) -> None:
    # drift = q0² exactly (slope 2) for q0 ≤ 0.1; the q0 = 0.5 row is left out of the fit.
    rows = [{"mode": "homogeneous", "group_size": "8", "normalisation": "mean", "seed": "0",
             "q0": str(q), "drift": str(q * q if q <= 0.1 else 1.0), "drift_reached": "1",
             "converted": str(int(q > 0.05))} for q in (0.5, 0.0625, 0.03125, 0.015625)]
    text = collect.drift_seed_slopes(rows)
    assert "| homogeneous | 8 | mean | 1 | 2 ± nan | 3/3 | 1/3 |" in text
