"""The `rlscope` command line: train (help, run directory, tidy CSV, seeds, invalid configs),
methods and tasks."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest

from rlscope.cli import main
from rlscope.methods import METHODS
from rlscope.metrics.sinks import read_jsonl
from rlscope.tasks import TASKS

SMALL = ["--batch_size", "16", "--seq_len", "4", "--eval_every", "1", "--eval_batches", "1",
         "--eval_batch_size", "16", "--device", "cpu", "--no_progress"]


@pytest.fixture(autouse=True)
def _fixed_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rich and tyro wrap to the terminal width; fix it so names are never truncated."""
    monkeypatch.setenv("COLUMNS", "200")


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_top_level_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("train", "demo", "bench", "methods", "tasks"):
        assert command in out
    assert main([]) == 2
    assert main(["nope"]) == 2
    assert "unknown command 'nope'" in capsys.readouterr().err


def test_train_help_documents_fields(capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")  # one column: each docstring stays on its own lines
    with pytest.raises(SystemExit) as info:
        main(["train", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for flag, doc in [
        ("--num_steps", "Optimizer steps (sampling rounds)"),
        ("--advantage", "Override the advantage estimator"),
        ("--top_p", "Nucleus sampling"),
        ("--seq_len", "Content tokens per prompt"),
        ("--clip_low", "PPO ε_low"),
        ("--method", "Update rule preset"),
        ("--lr", "Learning rate"),
        ("--no_progress", "Show the live progress bar"),
    ]:
        assert flag in out, flag
        assert doc in out, doc
    assert "(default: 300)" in out  # num_steps default is shown


def test_train_writes_run_directory_and_csv(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    out_csv = tmp_path / "r.csv"
    rc = main(["train", "--num_steps", "2", *SMALL, "--runs_dir", str(tmp_path), "--name", "x",
               "--output", str(out_csv)])
    assert rc == 0
    run = tmp_path / "x"
    config = json.loads((run / "config.json").read_text())
    for key in ("config", "derived", "method_spec", "torch_version", "git_commit", "device"):
        assert key in config, key
    assert config["config"]["run"]["num_steps"] == 2
    assert config["config"]["task_options"]["seq_len"] == 4
    assert config["config"]["method"] == "grpo"
    assert config["derived"]["group_size"] == 8 and config["derived"]["num_prompts"] == 2
    assert config["device"] == "cpu"

    metrics = _lines(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1]
    evals = _lines(run / "eval.jsonl")
    assert [e["step"] for e in evals] == [0, 1, 2]
    samples = _lines(run / "samples.jsonl")
    assert len(samples) == 4 and all(s["step"] == 0 for s in samples)
    assert set(samples[0]) == {"step", "prompt", "completion", "reward", "advantage"}
    assert len(samples[0]["completion"]) == 4  # type: ignore[arg-type]
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "completed" and status["steps"] == 2
    assert (run / "checkpoints" / "latest.pt").exists()

    rows = _csv(out_csv)
    assert len(rows) == len(evals) == 3
    for row, ev in zip(rows, evals, strict=True):
        assert row["method"] == "grpo" and row["seed"] == "0" and row["run"] == "x"
        assert int(row["step"]) == ev["step"]
        assert float(row["eval/test_error"]) == pytest.approx(ev["eval/test_error"])
    assert "x" in capsys.readouterr().out  # the summary table names the run directory


def test_train_num_seeds_runs_each_seed(tmp_path: Path) -> None:
    out_csv = tmp_path / "r.csv"
    rc = main(["train", "--method", "reinforce", "--num_steps", "2", "--num_seeds", "2",
               *SMALL, "--eval_every", "0", "--runs_dir", str(tmp_path), "--name", "x",
               "--output", str(out_csv)])
    assert rc == 0
    rows = _csv(out_csv)
    assert [(r["seed"], r["step"], r["run"]) for r in rows] == [("0", "2", "x_s0"),
                                                               ("1", "2", "x_s1")]
    assert rows[0]["eval/test_error"] != "" and rows[1]["eval/test_error"] != ""
    for seed in (0, 1):
        config = json.loads((tmp_path / f"x_s{seed}" / "config.json").read_text())
        assert config["config"]["run"]["seed"] == seed


def test_train_invalid_config_exits_2_naming_the_field(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    rc = main(["train", "--group_size", "1", *SMALL, "--runs_dir", str(tmp_path / "runs")])
    assert rc == 2
    assert "group_size" in capsys.readouterr().err
    rc = main(["train", "--clip_low", "-0.1", *SMALL, "--runs_dir", str(tmp_path / "runs")])
    assert rc == 2
    assert "clip_low" in capsys.readouterr().err
    rc = main(["train", "--method", "nope", *SMALL, "--runs_dir", str(tmp_path / "runs")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "nope" in err and "dr_grpo" in err
    assert not (tmp_path / "runs").exists()


def test_train_unparseable_value_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["train", "--num_steps", "many"])
    assert info.value.code == 2
    captured = capsys.readouterr()
    assert "num_steps" in captured.out + captured.err


def test_methods_lists_every_preset(capsys: pytest.CaptureFixture[str]) -> None:
    """One line of components per preset, then its description."""
    assert main(["methods"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for name, spec in METHODS.items():
        row = next(i for i, line in enumerate(lines) if line.split(" ", 1)[0] == name)
        assert spec.advantage.name in lines[row] and spec.agg in lines[row], name
        assert lines[row + 1].strip() == spec.description, name
    grpo = next(line for line in lines if line.startswith("grpo "))
    assert grpo.split(None, 1)[1] == ("group_zscore · ppo_clip ε 0.2/0.2 · token_mean · "
                                      "KL k3→behaviour β 0.04 · mixed_groups")


def test_methods_detail_accepts_aliases(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["methods", "DrGRPO"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"dr_grpo: {METHODS['dr_grpo'].description}")
    assert "group_center (--advantage)" in out and "seq_mean_token_sum (--agg)" in out
    assert f"source         {METHODS['dr_grpo'].source}" in out
    assert f"valid regime   {METHODS['dr_grpo'].regime}" in out
    # the settings the objective reads, with their current values and flags
    assert "clip_low 0.2 (--clip_low), clip_high 0.2 (--clip_high)" in out
    assert "coef 0.04 (--kl_coef), estimator k3 (--kl_estimator)" in out


def test_methods_detail_shows_component_docs_and_needs(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["methods", "replay_dg"]) == 0
    out = capsys.readouterr().out
    assert "run needs      replay" in out
    assert "delight (--gate); eta 1.0 (--eta)" in out
    assert "Delightful policy gradient: g = σ(A·(−ℓ)/η), w = g·A." in out
    assert main(["methods", "tpo"]) == 0
    assert "group_zscore (logged only" in capsys.readouterr().out


def test_methods_unknown_returns_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["methods", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown method 'nope'" in err and "grpo" in err


def test_tasks_lists_every_task(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tasks"]) == 0
    out = capsys.readouterr().out
    for name in TASKS:
        assert name in out, name


def test_parallel_seeds_equal_sequential_seeds(tmp_path: Path) -> None:
    """--jobs 2 runs each seed in its own process with the same results as one after another
    (same thread count per run), and both seeds' evaluations land in one CSV."""
    common = ["train", "--method", "dg", "--num_steps", "4", "--batch_size", "16",
              "--seq_len", "4", "--eval_every", "2", "--eval_batches", "1",
              "--eval_batch_size", "8", "--num_seeds", "2", "--threads", "1",
              "--device", "cpu", "--no_progress"]
    for jobs in ("1", "2"):
        out = tmp_path / f"jobs{jobs}"
        assert main([*common, "--jobs", jobs, "--runs_dir", str(out), "--name", "r",
                     "--output", str(out / "results.csv")]) == 0
    for seed in (0, 1):
        rows = [[{k: v for k, v in row.items() if not k.startswith(("time/", "throughput/"))}
                 for row in read_jsonl(tmp_path / f"jobs{jobs}" / f"r_s{seed}" / "metrics.jsonl")]
                for jobs in ("1", "2")]
        assert rows[0] == rows[1] and len(rows[0]) == 4
    with (tmp_path / "jobs2" / "results.csv").open() as f:
        csv_rows = list(csv.DictReader(f))
    assert sorted((r["seed"], r["step"]) for r in csv_rows) == [
        ("0", "0"), ("0", "2"), ("0", "4"), ("1", "0"), ("1", "2"), ("1", "4")]


# ------------------------------------------------------------ bad input and error reporting

def _problems(err: str) -> list[str]:
    """The problem lines of an ``error: invalid configuration:`` report (asserting its form)."""
    lines = err.strip().splitlines()
    assert lines[0] == "error: invalid configuration:", err
    assert all(line.startswith("  - ") for line in lines[1:]), err
    assert "Traceback" not in err
    return [line[4:] for line in lines[1:]]


@pytest.mark.parametrize(("flags", "fragment"), [
    (["--lr", "inf"], "optim.lr=inf must be a finite number (--lr)"),
    (["--temperature", "nan"], "sampling.temperature=nan must be a finite number"),
    (["--kl_coef", "nan"], "method.kl_coef=nan must be a finite number (--kl_coef)"),
    (["--checkpoint_every", "-1"], "run.checkpoint_every=-1 must be >= 0"),
    (["--device", "cuda:7"], "run.device='cuda:7' but "),
    (["--device", "tpu"], "run.device='tpu' is not a device"),
    (["--init", "{tmp}/nope"], "--init {tmp}/nope: no such file or directory"),
    (["--init", "{tmp}"], "--init {tmp}: the directory holds neither sft.pt nor"),
    (["--resume", "{tmp}/nope"], "--resume {tmp}/nope: no such file or directory"),
    (["--runs_dir", "{tmp}/file/runs"], "--runs_dir {tmp}/file/runs: {tmp}/file is a file"),
    (["--output", "{tmp}/file/r.csv"], "--output {tmp}/file: {tmp}/file is a file"),
    (["--name", "../../x"], "--name '../../x' holds a path separator"),
    (["--name", ".."], "--name '..' is a relative directory reference"),
    (["--task", "preference_rm", "--method", "ppo", "--rm_path", "{tmp}/nope"],
     "--rm_path {tmp}/nope: no reward model there"),
    (["--batch_size", "40000000", "--seq_len", "10"], "lower --batch_size"),
])
def test_train_bad_input_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               flags: list[str], fragment: str) -> None:
    (tmp_path / "file").write_text("not a directory")
    runs = tmp_path / "sub" / "runs"
    argv = ["train", *SMALL, "--runs_dir", str(runs), *(f.format(tmp=tmp_path) for f in flags)]
    assert main(argv) == 2
    problems = _problems(capsys.readouterr().err)
    assert any(fragment.format(tmp=tmp_path) in p for p in problems), problems
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # nothing written anywhere


def test_a_runtime_error_is_one_line_and_debug_shows_the_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
        ) -> None:
    def fails_while_running(cfg: object) -> None:  # an error the checks cannot foresee
        raise RuntimeError("the run broke at step 3")

    monkeypatch.setattr("rlscope.seeds.run_seeds", fails_while_running)
    argv = ["train", *SMALL, "--num_steps", "1", "--runs_dir", str(tmp_path / "runs")]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("error: RuntimeError: the run broke at step 3"), err
    assert err.rstrip().endswith("(run again with --debug for the traceback)")
    with pytest.raises(RuntimeError, match=r"the run broke"):  # --debug, anywhere in argv
        main(["--debug", *argv])
    with pytest.raises(RuntimeError, match=r"the run broke"):
        main([*argv, "--debug"])


def test_a_refused_checkpoint_is_one_line_with_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "weights.pt"
    bad.write_text("not a checkpoint")  # readable, so validation passes; loading refuses it
    argv = ["train", *SMALL, "--num_steps", "1", "--runs_dir", str(tmp_path / "runs"),
            "--init", str(bad)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"--init {bad}: refused: not an rlscope checkpoint" in err, err


def test_debug_prints_the_traceback_in_a_subprocess(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    train = ["train", *SMALL, "--runs_dir", str(tmp_path / "runs"), "--num_steps", "1"]
    # the console script's entry point, with a training run that breaks while running
    script = ("import sys, rlscope.seeds as seeds\n"
              "def fails(cfg):\n    raise RuntimeError('the run broke at step 3')\n"
              "seeds.run_seeds = fails\n"
              "from rlscope.cli import main\nsys.exit(main(sys.argv[1:]))\n")
    argv = [sys.executable, "-c", script, *train]
    plain = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    debug = subprocess.run([*argv, "--debug"], capture_output=True, text=True, env=env,
                           timeout=120)
    assert plain.returncode == 1 and debug.returncode == 1
    assert "Traceback" not in plain.stderr
    [line] = plain.stderr.splitlines()
    error_type = re.match(r"error: (\w+): ", line)
    assert error_type, line
    assert "Traceback (most recent call last)" in debug.stderr
    assert debug.stderr.strip().splitlines()[-1].split(":")[0].endswith(error_type[1])


@pytest.mark.parametrize(("argv", "fragment"), [
    (["sft", "--device", "cuda:7", "--name", "a/b"], "--name 'a/b' holds a path separator"),
    (["sft", "--lr", "nan"], "lr=nan must be a finite number (--lr)"),
    (["rm", "--name", "../x"], "--name '../x' holds a path separator"),
    (["rm", "--num_steps", "-3"], "num_steps=-3 must be >= 0"),
    (["demo", "--threads", "-1", "--methods", "nope"], "threads=-1 must be >= 0"),
    (["demo", "--methods", "nope"], "--methods: unknown method 'nope'"),
    (["bench", "--device", "nonsense"], "device='nonsense' is not a device"),
    (["bench", "--repeats", "-1"], "repeats=-1 must be >= 0"),
    (["serve", "--long_poll_s", "nan"], "long_poll_s=nan must be a finite number"),
])
def test_every_command_checks_its_options(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch, argv: list[str],
                                          fragment: str) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert any(fragment in p for p in _problems(capsys.readouterr().err))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["train", "sweep", "doctor", "report", "sft", "rm", "serve",
                                     "demo", "bench", "methods", "tasks"])
def test_every_command_reports_exceptions_in_one_line(
        command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
        ) -> None:
    """Whatever a command raises becomes one line; a missing optional module names its extra."""
    import rlscope.cli as cli

    def boom(args: list[str]) -> int:
        raise RuntimeError(f"{command} failed\nat step 3")

    def missing(args: list[str]) -> int:
        raise ModuleNotFoundError("No module named 'transformers'", name="transformers")

    monkeypatch.setitem(cli.COMMANDS, command, boom)
    assert main([command]) == 1
    assert capsys.readouterr().err == (f"error: RuntimeError: {command} failed at step 3 (run "
                                       "again with --debug for the traceback)\n")
    monkeypatch.setitem(cli.COMMANDS, command, missing)
    assert main([command]) == 2
    assert capsys.readouterr().err == ("error: this command needs transformers: pip install "
                                       "'rlscope[hf]' (run again with --debug for the "
                                       "traceback)\n")


def test_top_level_help_documents_debug(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "--debug" in out and "exit codes" in out


def test_demo_threads_reach_the_runs_and_the_layout_is_runs_demo_method_seed(
        tmp_path: Path) -> None:
    """`rlscope demo --threads N` sets torch's threads for each run (and restores them); the
    runs land in <runs_dir>/<method>_s<seed>, the layout the README's doctor command uses."""
    import torch
    from rich.console import Console

    from rlscope.demo import DemoConfig, run_demo

    before = torch.get_num_threads()
    cfg = DemoConfig(methods=("grpo",), num_steps=1, runs_dir=str(tmp_path / "demo"),
                     progress=False, threads=1)
    [row] = run_demo(cfg, Console(file=io.StringIO()))
    assert row["method"] == "grpo" and row["steps"] == 1.0
    run = tmp_path / "demo" / "grpo_s0"
    config = json.loads((run / "config.json").read_text())
    assert config["config"]["run"]["threads"] == 1
    assert torch.get_num_threads() == before
    assert DemoConfig().threads == 2 and DemoConfig().runs_dir == "runs/demo"


def test_git_commit_marks_a_dirty_checkout(tmp_path: Path) -> None:
    """A working tree that differs from HEAD (as a copied tree over an older .git does) is
    recorded as ``<hash>+dirty``, not as the commit it does not match."""
    import subprocess

    from rlscope.utils import git_commit

    def git(*args: str) -> str:
        return subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args],
                              cwd=tmp_path, capture_output=True, text=True, check=True).stdout

    assert git_commit(tmp_path) is None  # not a checkout
    git("init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    git("add", "a.txt")
    git("commit", "-qm", "one")
    head = git("rev-parse", "HEAD").strip()
    assert git_commit(tmp_path) == head
    (tmp_path / "new.txt").write_text("untracked files do not count\n")
    assert git_commit(tmp_path) == head
    (tmp_path / "a.txt").write_text("two\n")
    assert git_commit(tmp_path) == head + "+dirty"
