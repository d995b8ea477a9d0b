"""`rlscope sweep` end to end: a two-run, two-seed sweep and its outputs, the dry run, resuming
a killed sweep (only unfinished runs run again), and a failing run that does not stop the
others."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import pytest

from rlscope.cli import main
from rlscope.config import TrainConfig
from rlscope.metrics.sinks import read_jsonl
from rlscope.sweep.aggregate import load_tidy
from rlscope.sweep.manifest import parse_manifest
from rlscope.sweep.runner import SweepOptions, run_sweep

SMALL = """
[defaults]
task = "token_reversal"
num_steps = 3
batch_size = 16
seq_len = 4
eval_batches = 1
eval_batch_size = 16
eval_every = 2
device = "cpu"
threads = 1
"""

TWO_BY_TWO = """
[sweep]
name = "tiny"
seeds = [0, 1]
""" + SMALL + """
[runs.grpo]
method = "grpo"

[runs.dg]
method = "dg"
"""


@pytest.fixture(autouse=True)
def _fixed_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")


def _write(tmp_path: Path, text: str, name: str = "m.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_two_runs_two_seeds_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                       ) -> None:
    manifest = _write(tmp_path, TWO_BY_TWO)
    out = tmp_path / "out"
    assert main(["sweep", str(manifest), "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    runs = ["grpo_s0", "grpo_s1", "dg_s0", "dg_s1"]
    for k, run in enumerate(runs, 1):
        assert f"[{k}/4] {run} completed in" in printed
    assert "sweep tiny: 4 completed, 0 out of regime, 0 skipped, 0 failed" in printed
    assert (out / "manifest.toml").read_text() == TWO_BY_TWO

    index = json.loads((out / "sweep.json").read_text())
    assert [r["run"] for r in index["runs"]] == runs
    assert all(r["status"] == "completed" and r["plan"] == "run" and r["wall_time_s"] > 0
               for r in index["runs"])
    assert index["runs"][0]["command"].startswith("rlscope train --task token_reversal")
    assert "torch_version" in index["machine"]
    # each run's console output has its own log, starting with its command
    assert (out / "logs" / "dg_s1.log").read_text().startswith(
        f"$ {index['runs'][3]['command']}\n")

    # results.csv: one row per logged number of every run
    rows = load_tidy(out / "results.csv")
    expected = 0
    for run in runs:
        for kind, file in (("train", "metrics.jsonl"), ("eval", "eval.jsonl")):
            records = read_jsonl(out / "runs" / run / file)
            expected += sum(len(r) - 1 for r in records)
            mine = [r for r in rows if r.run == run and r.kind == kind]
            assert {(r.step, r.metric) for r in mine} == {
                (rec["step"], k) for rec in records for k in rec if k != "step"}
    assert len(rows) == expected
    assert {(r.name, r.method, r.seed) for r in rows} == {
        ("grpo", "grpo", 0), ("grpo", "grpo", 1), ("dg", "dg", 0), ("dg", "dg", 1)}
    assert (out / "results.parquet").exists()

    # final.csv: each seed's value is that run's own last evaluation
    with (out / "final.csv").open() as f:
        final = list(csv.DictReader(f))
    assert {(c["name"], c["metric"]) for c in final} == {
        (n, m) for n in ("grpo", "dg") for m in ("eval/test_error", "eval/entropy")}
    for cell in final:
        last = [read_jsonl(out / "runs" / f"{cell['name']}_s{s}" / "eval.jsonl")[-1]
                for s in (0, 1)]
        values = [float(v) for v in cell["values"].split()]
        assert values == [e[cell["metric"]] for e in last]
        assert float(cell["mean"]) == pytest.approx(sum(values) / 2)
        assert float(cell["sd"]) == pytest.approx(abs(values[0] - values[1]) / math.sqrt(2))
        assert cell["n"] == "2" and cell["steps"] == "3 3"
    assert "| grpo | grpo |" in (out / "final.md").read_text()
    assert "`eval/entropy` <= 0.1" in (out / "crossings.md").read_text()
    assert (out / "curves.csv").read_text().startswith("name,method,kind,metric,step,mean")


def test_dry_run_prints_the_runs_and_runs_nothing(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    manifest = _write(tmp_path, TWO_BY_TWO + "grid = { lr = [0.001, 0.01] }\n")
    out = tmp_path / "out"
    assert main(["sweep", str(manifest), "--dry_run", "--output", str(out), "--jobs", "2"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"sweep tiny: 6 runs (3 ids × 2 seeds) → {out}\n")
    assert f"dg-lr=0.01  seed 1  {out}/runs/dg-lr=0.01_s1  [run]" in printed
    assert (f"rlscope train --task token_reversal --num_steps 3 --batch_size 16 --seq_len 4 "
            f"--eval_batches 1 --eval_batch_size 16 --eval_every 2 --device cpu --threads 1 "
            f"--method dg --lr 0.01 --seed 1 --runs_dir {out}/runs --name dg-lr=0.01_s1 "
            "--no_progress") in printed
    assert not out.exists()


def test_manifest_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = _write(tmp_path, SMALL + "[runs.a]\nmethod = \"grpo\"\nnum_step = 3\n")
    assert main(["sweep", str(manifest), "--dry_run"]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: {manifest}: [runs.a] num_step: not an `rlscope train` option "
                   "(did you mean 'num_steps'?)\n")  # one problem, one line
    assert main(["sweep", str(tmp_path / "missing.toml")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_resume_after_a_killed_sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three runs finish; then one is made to look killed during step 2, after its step-2
    checkpoint (no status, no later checkpoint, a half-written line), one killed before any
    checkpoint, and one is left alone. Running the sweep again resumes the first from step 2,
    restarts the second, skips the third, and the logs come out the same as before."""
    text = SMALL + "checkpoint_every = 2\n[runs.a]\nmethod = \"grpo\"\n[runs.b]\n" \
        "method = \"dg\"\n[runs.c]\nmethod = \"reinforce\"\n"
    out = tmp_path / "out"
    first = run_sweep(parse_manifest(text, output=out))
    assert [r.status for r in first.records] == ["completed"] * 3
    a, b, c = (out / "runs" / f"{n}_s0" for n in "abc")
    logs = {d: {f: (d / f).read_text() for f in ("metrics.jsonl", "eval.jsonl")}
            for d in (a, b)}
    c_status = (c / "status.json").stat().st_mtime_ns

    (a / "status.json").unlink()
    (a / "checkpoints" / "step_3.pt").unlink()
    (a / "checkpoints" / "latest.pt").write_text("step_2.pt")
    with (a / "eval.jsonl").open("a") as f:  # cut off by the kill
        f.write('{"step": 3, "ev')
    (b / "status.json").unlink()
    for p in (b / "checkpoints").iterdir():
        p.unlink()

    from rlscope import train as train_module
    calls: list[TrainConfig] = []
    real = train_module.train

    def counting(cfg: TrainConfig) -> Any:
        calls.append(cfg)
        return real(cfg)

    monkeypatch.setattr(train_module, "train", counting)
    lines: list[str] = []
    second = run_sweep(parse_manifest(text, output=out), report=lines.append)
    assert [cfg.run.name for cfg in calls] == ["a_s0", "b_s0"]
    assert calls[0].run.resume == str(a) and calls[1].run.resume == ""
    assert [(r.plan, r.status) for r in second.records] == [
        ("resume", "completed"), ("restart", "completed"), ("skip", "completed")]
    assert lines[:3] == ["resume   a_s0 (interrupted, checkpoint at step 2)",
                         "restart  b_s0 (interrupted, no checkpoint)",
                         "skip     c_s0 (completed)"]
    assert second.count("completed") == 2 and second.skipped == 1
    assert (c / "status.json").stat().st_mtime_ns == c_status
    assert sorted(p.name for p in out.joinpath("runs").iterdir()) == ["a_s0", "b_s0", "c_s0"]

    def strip(text: str) -> list[dict[str, Any]]:
        return [{k: v for k, v in json.loads(line).items() if not k.startswith(("time/",
                                                                              "throughput/"))}
                for line in text.splitlines()]

    # a's step 2 and evaluations at 2 and 3 were logged before the "kill" and again after it:
    # each appears once, with the same values
    for d in (a, b):
        for f, before in logs[d].items():
            assert strip((d / f).read_text()) == strip(before), (d.name, f)

    # a changed configuration restarts the run, whatever its status
    third = run_sweep(parse_manifest(text.replace("[runs.c]\n", "[runs.c]\nlr = 0.01\n"),
                                     output=out), SweepOptions(threads=2))
    assert [(r.plan, r.reason) for r in third.records] == [
        ("skip", "completed"), ("skip", "completed"),
        ("restart", "the manifest now gives a different configuration")]


def test_a_failing_run_is_reported_and_the_others_complete(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two worker processes; one run starts from a corrupt weights file, which passes
    validation (it exists and is readable) and fails when training loads it."""
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_text("not a checkpoint")
    text = SMALL + "[runs.ok]\nmethod = \"grpo\"\n[runs.broken]\nmethod = \"grpo\"\n" \
        f"init = \"{corrupt}\"\n[runs.also_ok]\nmethod = \"dg\"\n"
    manifest = _write(tmp_path, text)
    out = tmp_path / "out"
    assert main(["sweep", str(manifest), "--output", str(out), "--jobs", "2"]) == 1
    printed = capsys.readouterr().out
    assert "broken_s0 FAILED: " in printed
    assert "sweep m: 2 completed, 0 out of regime, 0 skipped, 1 failed" in printed
    assert "  failed broken_s0: " in printed
    index = {r["run"]: r for r in json.loads((out / "sweep.json").read_text())["runs"]}
    assert index["ok_s0"]["status"] == index["also_ok_s0"]["status"] == "completed"
    broken = index["broken_s0"]
    assert broken["status"] == "failed" and broken["error"] and "Traceback" in broken["traceback"]
    assert "Traceback" in (out / "logs" / "broken_s0.log").read_text()
    assert {r.name for r in load_tidy(out)} == {"ok", "also_ok"}


def test_builtin_evidence_manifest_validates(capsys: pytest.CaptureFixture[str]) -> None:
    """The evidence suite's 47 configurations × 3 seeds pass every check before anything runs,
    the experiments issue 15 added among them; an unknown built-in name lists the valid ones."""
    from rlscope.cli import main

    assert main(["sweep", "--builtin", "evidence", "--dry_run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("sweep evidence: 141 runs (47 ids × 3 seeds)")
    assert "noise-filtered_dg-filter_tau=0.2  seed 2" in out
    # issue 15: the init ablation, the clip / Dr. GRPO ablation and the larger-model runs
    for run_id, args in [
            ("init-dg-embed_init=balanced", "--method dg --embed_init balanced"),
            ("init-tpo-embed_init=reference", "--embed_init reference"),
            ("clip-grpo_group_center", "--advantage group_center"),
            ("clip-dr_grpo", "--method dr_grpo"),
            ("clip-grpo_eps0.1", "--clip_low 0.1 --clip_high 0.1"),
            ("clip-grpo_eps0.05", "--clip_low 0.05 --clip_high 0.05"),
            ("scale-grpo", "--arch qwen2 --d_model 512 --n_layers 8 --n_heads 8"),
            ("scale-tpo", "--method tpo"),
            ("scale_bandit-grpo", "--task lm_bandit")]:
        for seed in (0, 1, 2):
            line = next(line for line in out.splitlines()
                        if line.startswith("  rlscope train ") and f"--name {run_id}_s{seed} "
                        in line)
            assert args in line, (run_id, line)
    assert "--entropy_diagnostics" in next(line for line in out.splitlines()
                                           if "--name clip-grpo_eps0.05_s0 " in line)
    assert main(["sweep", "--builtin", "nope"]) == 2
    err = capsys.readouterr().err
    assert "built-in manifests: " in err and ", evidence," in err
    assert main(["sweep"]) == 2
    assert "give either a MANIFEST.toml or --builtin NAME" in capsys.readouterr().err


def test_resume_when_killed_between_a_checkpoint_and_its_pointer(tmp_path: Path) -> None:
    """A kill after ``step_4.pt`` is renamed into place but before ``latest.pt`` points at
    it: the sweep resumes from step 4 (the checkpoint `train --resume` loads), not from the
    pointer's step 2, so no logged step is lost and the logs come out as before. (Trimming
    the logs at the pointer's step lost steps 2-3: the flaky kill -9 test in CI.)"""
    text = SMALL.replace("num_steps = 3", "num_steps = 6") + \
        "checkpoint_every = 2\n[runs.a]\nmethod = \"grpo\"\n"
    out = tmp_path / "out"
    assert [r.status for r in run_sweep(parse_manifest(text, output=out)).records] == [
        "completed"]
    a = out / "runs" / "a_s0"
    before = {f: (a / f).read_text() for f in ("metrics.jsonl", "eval.jsonl")}
    (a / "status.json").unlink()
    (a / "checkpoints" / "step_6.pt").unlink()
    (a / "checkpoints" / "latest.pt").write_text("step_2.pt")
    lines: list[str] = []
    again = run_sweep(parse_manifest(text, output=out), report=lines.append)
    assert [(r.plan, r.status) for r in again.records] == [("resume", "completed")]
    assert lines[0] == "resume   a_s0 (interrupted, checkpoint at step 4)"

    def strip(text: str) -> list[dict[str, Any]]:
        return [{k: v for k, v in json.loads(line).items()
                 if not k.startswith(("time/", "throughput/"))} for line in text.splitlines()]

    for f, old in before.items():
        assert strip((a / f).read_text()) == strip(old), f


def test_builtin_rules2026_manifest_validates(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 19's evidence matrix passes every check before anything runs: each 2025-26 preset
    beside its parent on three settings, the mismatch presets again under a mismatched sampler,
    3 seeds."""
    from rlscope.cli import main

    assert main(["sweep", "--builtin", "rules2026", "--dry_run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("sweep rules2026: 210 runs (70 ids × 3 seeds)")
    for run_id, args in [("clean-gmpo", "--method gmpo"),
                         ("noise-vapo", "--reward_noise 0.2"),
                         ("masked-opo", "--task masked_reversal"),
                         ("mismatch-icepop", "--top_p 0.9 --no_replay_sampling_mask")]:
        line = next(line for line in out.splitlines() if f"--name {run_id}_s0 " in line)
        assert args in line, (run_id, line)
    assert "--method opd" not in out and "--method gkd" not in out  # they need a teacher run
