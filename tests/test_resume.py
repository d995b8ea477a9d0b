"""Resume after ``kill -9``: the run's logs and CSV rows equal an uninterrupted run's (no
duplicates), also when the kill cut a log line or the newest checkpoint is damaged; a changed
configuration is refused; a run whose loss goes non-finite ends ``diverged``."""

from __future__ import annotations

import csv
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rlscope.cli import _tyro_parse, main
from rlscope.config import ConfigError, TrainConfig
from rlscope.metrics.sinks import LiveDisplay, read_jsonl, truncate_csv_rows, truncate_jsonl
from rlscope.train import train

NUM_STEPS = 60
CHECKPOINT_EVERY = 3
ARGS = ["--method", "grpo", "--seq_len", "4", "--eval_batches", "1", "--eval_batch_size", "8",
        "--batch_size", "16", "--num_steps", str(NUM_STEPS), "--eval_every", "4",
        "--checkpoint_every", str(CHECKPOINT_EVERY), "--threads", "1", "--device", "cpu",
        "--no-progress", "--log_samples", "2", "--samples_every", "3", "--d_model", "16",
        "--n_layers", "1", "--doctor_every", "0"]
"""A tiny, fast run (about 8 ms a step on one CPU thread), checkpointed every few steps."""
TIMING = ("time/", "throughput/", "perf/", "wall_time_s")
"""Wall-clock fields (metrics/schema.py: ``time/*``, ``throughput/*``, ``perf/*``; the CSV's
``wall_time_s``): the only ones a resumed run may log differently."""
SRC = Path(__file__).resolve().parents[1] / "src"


def _config(runs_dir: Path, *extra: str) -> TrainConfig:
    cfg = _tyro_parse(TrainConfig, [*ARGS, "--runs_dir", str(runs_dir), *extra], "test")
    assert isinstance(cfg, TrainConfig)
    return cfg


def _untimed(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if not k.startswith(TIMING)}


def _csv(path: Path) -> list[dict[str, Any]]:
    with path.open(newline="", encoding="utf-8") as f:
        return [_untimed(row) for row in csv.DictReader(f)]


def _logs(run_dir: Path, output: Path) -> dict[str, list[dict[str, Any]]]:
    logs = {name: [_untimed(r) for r in read_jsonl(run_dir / name)]
            for name in ("metrics.jsonl", "eval.jsonl", "samples.jsonl")}
    return logs | {"csv": _csv(output)}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """The logs of the same run, uninterrupted (same run name, so the CSV rows match)."""
    root = tmp_path_factory.mktemp("reference")
    result = train(_config(root, "--name", "run", "--output", str(root / "out.csv")))
    assert result.status == "completed"
    return _logs(result.run_dir, root / "out.csv")


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def _kill_at(tmp_path: Path, lines: int) -> Path:
    """Start `rlscope train` in a subprocess and SIGKILL it once metrics.jsonl holds ``lines``
    lines; the run directory."""
    run_dir = tmp_path / "runs" / "run"
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from rlscope.cli import main; sys.exit(main())",
         "train", *ARGS, "--runs_dir", str(tmp_path / "runs"), "--name", "run",
         "--output", str(tmp_path / "out.csv")],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    try:
        while _lines(run_dir / "metrics.jsonl") < lines:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "the run never reached the kill point"
            time.sleep(0.001)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (run_dir / "status.json").exists()  # killed mid-run, not finished
    return run_dir


def _checkpoints(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "checkpoints").glob("step_*.pt"),
                  key=lambda p: int(p.stem.removeprefix("step_")))


SLOW = pytest.mark.slow
"""Each kill/resume test starts a Python process (a few seconds); two stay in the default
suite, the single-damage variants are marked slow."""


@pytest.mark.parametrize(("damage", "seed"), [
    pytest.param((), 0, id="clean"),
    pytest.param(("cut_line", "truncated_checkpoint"), 3, id="cut_line+truncated_checkpoint"),
    pytest.param(("cut_line",), 1, marks=SLOW, id="cut_line"),
    pytest.param(("truncated_checkpoint",), 2, marks=SLOW, id="truncated_checkpoint")])
def test_kill9_then_resume_equals_uninterrupted_run(
        tmp_path: Path, damage: tuple[str, ...], seed: int,
        reference: dict[str, list[dict[str, Any]]], capsys: pytest.CaptureFixture[str]) -> None:
    kill_at = random.Random(seed).randint(2 * CHECKPOINT_EVERY + 2, NUM_STEPS // 2)
    run_dir = _kill_at(tmp_path, kill_at)
    killed_lines = _lines(run_dir / "metrics.jsonl")
    assert killed_lines >= kill_at
    notices = []
    if "cut_line" in damage:  # the kill cut the last record mid-line
        metrics = run_dir / "metrics.jsonl"
        text = metrics.read_bytes()
        cut = len(text.splitlines()[-1]) // 2 + 1  # half the last record and its newline
        metrics.write_bytes(text[:len(text) - cut])
        notices.append("dropped the cut-off last line")
    if "truncated_checkpoint" in damage:  # the newest checkpoint lost its second half
        newest = _checkpoints(run_dir)[-1]
        newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
        notices.append(f"skipping checkpoint {newest}: truncated or corrupt")
        # and a later write was cut off before its rename
        partial = newest.with_name(f"step_{NUM_STEPS}.pt.tmp")
        partial.write_bytes(newest.read_bytes()[:100])
    capsys.readouterr()
    result = train(_config(tmp_path / "runs", "--resume", str(run_dir),
                           "--output", str(tmp_path / "out.csv")))
    assert result.status == "completed"
    err = capsys.readouterr().err
    assert all(notice in err for notice in notices), err
    assert _logs(run_dir, tmp_path / "out.csv") == reference
    status = json.loads((run_dir / "status.json").read_text())
    assert status["status"] == "completed" and status["steps"] == NUM_STEPS
    if "truncated_checkpoint" in damage:
        assert newest.with_name(newest.name + ".corrupt").exists() and not partial.exists()
        assert (run_dir / "checkpoints" / "latest.pt").read_text() == f"step_{NUM_STEPS}.pt"


def test_a_changed_configuration_is_refused_and_config_json_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = train(_config(tmp_path, "--name", "run", "--num_steps", "3"))
    config_json = (first.run_dir / "config.json").read_bytes()
    metrics = (first.run_dir / "metrics.jsonl").read_bytes()
    for extra, fields in ((["--method", "reinforce"], ["method: 'grpo' -> 'reinforce'"]),
                          (["--lr", "0.01"], ["optim.lr: 0.001 -> 0.01"]),
                          (["--lr", "0.01", "--seed", "3"], ["optim.lr", "run.seed"])):
        with pytest.raises(ConfigError, match=r"differs from the run's config\.json") as error:
            train(_config(tmp_path, "--resume", str(first.run_dir), *extra))
        assert all(f in str(error.value) for f in fields), str(error.value)
        assert "\n" not in str(error.value)
        assert (first.run_dir / "config.json").read_bytes() == config_json
        assert (first.run_dir / "metrics.jsonl").read_bytes() == metrics
    # the settings listed as free to change are accepted: more steps, other threads, no bar;
    # while the resumed leg trains, the first leg's "completed" status is gone (a kill now
    # must not leave a run that looks finished)
    status_during: list[bool] = []

    def display(*args: Any, **kwargs: Any) -> LiveDisplay:
        status_during.append((first.run_dir / "status.json").exists())
        return LiveDisplay(*args, **kwargs)

    monkeypatch.setattr("rlscope.train.LiveDisplay", display)
    more = train(_config(tmp_path, "--resume", str(first.run_dir), "--num_steps", "5",
                         "--threads", "2", "--name", "other", "--checkpoint_every", "0"))
    assert more.status == "completed" and [m["step"] for m in more.metrics] == [3, 4]
    assert status_during == [False]
    stored = json.loads((first.run_dir / "config.json").read_text())["config"]
    assert stored["run"]["num_steps"] == 5
    with pytest.raises(ConfigError, match=r"num_steps=2 is below the step of the checkpoint"):
        train(_config(tmp_path, "--resume", str(first.run_dir), "--num_steps", "2"))


def test_the_cli_refuses_a_changed_method_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = train(_config(tmp_path, "--name", "run", "--num_steps", "2"))
    capsys.readouterr()
    assert main(["train", *ARGS, "--num_steps", "2", "--resume", str(first.run_dir),
                 "--method", "rloo"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "method: 'grpo' -> 'rloo'" in lines[0], lines


def test_a_nan_producing_run_ends_diverged(tmp_path: Path) -> None:
    result = train(_config(tmp_path, "--name", "nan", "--lr", "1e30", "--num_steps", "10"))
    assert result.status == "diverged"
    status = json.loads((result.run_dir / "status.json").read_text())
    assert status["status"] == "diverged"
    step = status["diverged_step"]
    assert step < 9 and status["steps"] == step + 1 and len(result.metrics) == step + 1
    assert status["diverged_metric"] in ("loss/total", "loss/policy", "parameters")
    assert f"step {step}" in status["reason"] and status["diverged_metric"] in status["reason"]
    assert result.reason == status["reason"]
    # the last checkpoint is the last finite one, never the diverged weights
    saved = [int(p.stem.removeprefix("step_")) for p in _checkpoints(result.run_dir)]
    assert all(s <= step for s in saved)


def test_the_cli_names_the_divergence(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                      ) -> None:
    assert main(["train", *ARGS, "--lr", "1e30", "--num_steps", "10",
                 "--runs_dir", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    line = next(x for x in captured.err.splitlines() if x.startswith("seed 0 diverged: "))
    assert "at step" in line and ("loss/" in line or "parameter" in line)
    assert "diverged" in captured.out  # the status column of the summary table


def test_truncate_jsonl_keeps_earlier_steps_and_drops_a_cut_line(tmp_path: Path) -> None:
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 0, "a": 1}\n{"note": "no step"}\n{"step": 1}\n{"step": 2}\n'
                   '{"step": 3, "a"')
    notices = truncate_jsonl(log, 2)
    assert log.read_text() == '{"step": 0, "a": 1}\n{"note": "no step"}\n{"step": 1}\n'
    assert any("cut-off last line 5" in n for n in notices)
    assert any("dropped 1 records of step 2" in n for n in notices)
    # a complete last record without its newline is kept and terminated
    log.write_text('{"step": 0}\n{"step": 1}')
    assert truncate_jsonl(log, 5) == []
    assert log.read_text() == '{"step": 0}\n{"step": 1}\n'


def test_truncate_csv_rows_drops_only_this_runs_later_rows(tmp_path: Path) -> None:
    out = tmp_path / "out.csv"
    out.write_text("run,step,x\na,0,1\nb,4,2\na,4,3\na,8,4\nb,8,5\na,12,")
    notices = truncate_csv_rows(out, "a", 4)
    assert out.read_text().splitlines() == ["run,step,x", "a,0,1", "b,4,2", "b,8,5"]
    assert len(notices) == 2 and "cut-off last row" in notices[0]


def test_docs_list_every_setting_that_may_change_on_resume() -> None:
    from rlscope.checkpoint import RESUME_MAY_CHANGE

    doc = (Path(__file__).resolve().parents[1] / "docs" / "training.md").read_text()
    section = doc.split("**What may change on resume.**")[1].split("- **Divergence.**")[0]
    assert all(f"`--{key.split('.')[-1]}`" in section for key in RESUME_MAY_CHANGE)
