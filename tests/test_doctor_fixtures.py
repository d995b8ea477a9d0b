"""The doctor on the committed foreign-log fixtures (tests/fixtures/doctor/README.md says how
each was produced and what pattern it holds): every metric line is read, names are translated
with their notes, and the planted patterns come out as findings."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

from rlscope.cli import main
from rlscope.doctor.diagnosis import Diagnosis, run_doctor
from rlscope.doctor.findings import Finding
from rlscope.doctor.importers import load
from rlscope.doctor.table import MetricTable

FIXTURES = Path(__file__).parent / "fixtures" / "doctor"


def _points_per_step(t: MetricTable) -> dict[int, int]:
    counts: collections.Counter[int] = collections.Counter()
    for name in t.names():
        counts.update(int(s) for s in t.series(name)[0])
    return dict(counts)


def _by_id(d: Diagnosis) -> dict[str, Finding]:
    return {f.id: f for f in d.findings}


def test_verl_console_log_every_step_including_wrapped_and_glued_lines() -> None:
    """45 steps of 59 training metrics; steps 7, 19 and 33 are wrapped at 200 columns and
    step 12 is glued to a progress bar: all read in full, nothing skipped. (perf/time_per_step
    repeats timing_s/step; it is kept under its own name, never merged into time/step.)"""
    (t,) = load(FIXTURES / "verl_console.log").tables
    counts = _points_per_step(t)
    assert set(counts) == set(range(46))
    for step in (7, 12, 19, 33):
        assert counts[step] == counts[1] == 59
    assert t.n_problems == 0
    # translated with the note on how verl's clip ratio is measured
    assert t.original["length/clip_ratio"] == "response_length/clip_ratio"
    assert "padded response width" in t.notes["length/clip_ratio"]
    assert t.original["policy/entropy"] == "actor/entropy"
    # the validation keys keep their names, including the slash in the data source
    assert "val-core/openai/gsm8k/acc/mean@8" in t.names()


def test_verl_console_log_findings() -> None:
    """The planted pattern: entropy below 0.1 from step 28, responses creeping to the 1024 cap
    (clip ratio 0 → ~0.25) and slowing the steps, validation accuracy rising."""
    (d,) = run_doctor(FIXTURES / "verl_console.log")
    found = _by_id(d)
    collapse = found["entropy_collapse"]
    assert collapse.step is not None and 28 <= collapse.step <= 30
    assert found["truncation"].evidence["last_window_mean"] > 0.2
    assert found["throughput_regression"].evidence["correlation_with_length"] > 0.9
    verdict = d.verdict
    assert verdict is not None and verdict.evidence["verdict"] == "improving"
    assert verdict.evidence["metric"].startswith("val-core/openai/gsm8k/acc/")
    assert d.validation["val-core/openai/gsm8k/acc/mean@8"]["evaluations"] == 6
    assert {"time/sample", "time/step"} <= set(d.phases)


def test_verl_garbage_log_reads_the_good_lines_and_reports_the_bad() -> None:
    (t,) = load(FIXTURES / "verl_console_garbage.log").tables
    counts = _points_per_step(t)
    assert set(counts) == set(range(1, 8))
    assert counts[1] == counts[3] == 59
    lines = {p.line for p in t.problems}
    assert {4, 6} <= lines  # the binary line and the line of malformed values
    assert all("unparsable" in p.message or "binary" in p.message or "key:value" in p.message
               for p in t.problems)


def test_tinker_metrics_jsonl() -> None:
    (d,) = run_doctor(FIXTURES / "tinker_metrics.jsonl")
    t = d.table
    assert t.fmt == "tinker" and t.original["reward/mean"] == "env/all/reward/total"
    assert len(t.series("reward/mean")[0]) == 30
    verdict = d.verdict
    assert verdict is not None and verdict.evidence["metric"] == "test/env/all/reward/total"
    assert verdict.evidence["verdict"] == "improving"


def test_wandb_chart_export_one_diagnosis_per_run() -> None:
    """Two runs' actor/entropy; the higher learning rate collapses about three times faster."""
    diagnoses = {d.table.source: d for d in run_doctor(FIXTURES / "wandb_chart_export.csv")}
    assert set(diagnoses) == {"grpo-qwen2.5-7b-lr3e-6", "grpo-qwen2.5-7b-lr1e-6"}
    fast = _by_id(diagnoses["grpo-qwen2.5-7b-lr3e-6"])["entropy_collapse"]
    slow = _by_id(diagnoses["grpo-qwen2.5-7b-lr1e-6"])["entropy_collapse"]
    assert fast.step < slow.step


def test_wandb_history_export_kl_runaway() -> None:
    """train/kl grows linearly, then exponentially after step 40."""
    (d,) = run_doctor(FIXTURES / "wandb_history_export.csv")
    assert "" not in d.table.names()  # pandas' unnamed index column is not a metric
    runaway = _by_id(d)["kl_runaway"]
    assert runaway.evidence["metric"] == "policy/kl_ref_k3"
    assert d.table.original["policy/kl_ref_k3"] == "train/kl"


@pytest.mark.parametrize("output", ["markdown", "json", "html"])
def test_cli_outputs(output: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / f"doctor.{output}"
    assert main(["doctor", str(FIXTURES / "verl_console.log"), "--output", output,
                 "--out", str(out)]) == 0
    text = out.read_text()
    if output == "json":
        (report,) = json.loads(text)
        assert "entropy_collapse" in {f["id"] for f in report["findings"]}
        assert report["translations"]["length/clip_ratio"]["from"] == \
            "response_length/clip_ratio"
    elif output == "markdown":
        assert "`entropy_collapse`" in text and "### Validation" in text
    else:
        assert text.startswith('<section class="rlscope-doctor">') and "<script" not in text


def test_cli_terminal_and_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["doctor", str(FIXTURES / "tinker_metrics.jsonl")]) == 0
    assert "learning_verdict" in capsys.readouterr().out
    empty = tmp_path / "empty.log"
    empty.write_text("")
    assert main(["doctor", str(empty)]) == 2
    assert "is empty" in capsys.readouterr().err
    assert main(["doctor", str(FIXTURES / "tinker_metrics.jsonl"), "--output", "pdf"]) == 2
    assert "--output 'pdf' is unknown" in capsys.readouterr().err


def test_real_trl_grpo_trainer_state() -> None:
    """TRL 1.16 GRPOTrainer, 120 steps of a tiny Llama (tests/fixtures/doctor/README.md): train
    entries, eval entries every 20 steps (kept under their eval_ names) and the final summary."""
    (d,) = run_doctor(FIXTURES / "trl_grpo_trainer_state.json")
    t = d.table
    assert t.fmt == "trl" and t.config["global_step"] == 120
    assert len(t.series("reward/mean")[0]) == 120
    assert t.original["policy/kl_ref_k3"] == "kl" and "during the update" in \
        t.notes["policy/kl_ref_k3"]
    assert t.series("eval_reward")[0].tolist() == [20.0, 40.0, 60.0, 80.0, 100.0, 120.0]
    assert t.has("train_runtime")
    # at most 6 completion tokens: most completions are cut at the limit
    found = _by_id(d)
    assert found["truncation"].evidence["last_window_mean"] > 0.5
    assert "entropy_collapse" not in found


def test_real_trl_grpo_with_a_learning_rate_ten_times_higher() -> None:
    """lr 0.1: entropy 2.9 → 0.18 by step 10, then every completion cut at the limit with
    reward 0 and frac_reward_zero_std 1."""
    (d,) = run_doctor(FIXTURES / "trl_grpo_high_lr_trainer_state.json")
    found = _by_id(d)
    collapse = found["entropy_collapse"]
    assert collapse.step is not None and collapse.step <= 15
    assert found["no_signal"].evidence["metric"] == "frac_reward_zero_std"
    assert found["truncation"].evidence["last_window_mean"] == 1.0
    verdict = d.verdict
    assert verdict is not None and verdict.evidence["verdict"] != "improving"


def test_real_trl_ppo_trainer_state() -> None:
    """TRL 1.12 experimental PPOTrainer: PPO names translated; val/ is the value function, not
    validation, so the learning verdict rests on the training reward and says so."""
    (d,) = run_doctor(FIXTURES / "trl_ppo_trainer_state.json")
    t = d.table
    assert t.original["policy/kl_ref_seq_k1"] == "objective/kl"
    assert t.original["loss/value"] == "loss/value_avg"
    assert t.original["value/clipfrac"] == "val/clipfrac_avg"
    verdict = d.verdict
    assert verdict is not None
    assert verdict.evidence["basis"] == "training reward (no validation logged)"
    assert "value_instability" not in _by_id(d)
