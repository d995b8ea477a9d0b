"""A sweep trusts a run directory only as far as its files bear it out: a run is completed only
once its step count and logs are verified; a finished-looking run that is incomplete runs
again; one corrupt run file fails that run (with the reason) and never the sweep; names that
would write outside the output folder are refused before anything runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlscope.cli import main
from rlscope.config import TrainConfig
from rlscope.sweep.aggregate import load_tidy
from rlscope.sweep.manifest import ManifestError, name_problem, parse_manifest
from rlscope.sweep.plan import expected_steps, plan_run, verify_run
from rlscope.sweep.runner import run_sweep

SMALL = """
[defaults]
task = "token_reversal"
num_steps = 4
batch_size = 16
seq_len = 4
eval_batches = 1
eval_batch_size = 16
eval_every = 2
checkpoint_every = 2
device = "cpu"
threads = 1
"""


@pytest.fixture(autouse=True)
def _fixed_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")


def _steps(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def _without_timings(path: Path) -> list[dict[str, Any]]:
    return [{k: v for k, v in json.loads(line).items()
             if not k.startswith(("time/", "throughput/"))}
            for line in path.read_text().splitlines()]


def test_expected_steps_follow_delay_replay_and_eval_every() -> None:
    def cfg(text: str) -> TrainConfig:
        return parse_manifest(SMALL + "[runs.r]\nmethod = \"grpo\"\n" + text).runs[0].config

    assert expected_steps(cfg("")) == (range(0, 4), [0, 2])
    assert expected_steps(cfg("delay = 1\n")) == (range(0, 4), [1, 3])  # the warm-up trains
    assert expected_steps(cfg("delay = 1\nreplay_capacity = 4\n")) == (range(0, 4), [1, 3])
    assert expected_steps(cfg("eval_every = 0\n")) == (range(0, 4), [])


def test_fresh_runs_verify_also_with_delay_and_replay(tmp_path: Path) -> None:
    """What train writes is what verification expects, with a delay without and with replay
    (evaluations start at the delay), and a second invocation skips every run."""
    text = SMALL + "[runs.plain]\nmethod = \"grpo\"\n[runs.late]\nmethod = \"grpo\"\n" \
        "delay = 1\n[runs.replay]\nmethod = \"grpo\"\ndelay = 1\nreplay_capacity = 4\n"
    out = tmp_path / "out"
    first = run_sweep(parse_manifest(text, output=out))
    assert [(r.run, r.status) for r in first.records] == [
        ("plain_s0", "completed"), ("late_s0", "completed"), ("replay_s0", "completed")]
    assert _steps(out / "runs" / "late_s0" / "metrics.jsonl") == [0, 1, 2, 3]  # warm-up trains
    assert _steps(out / "runs" / "replay_s0" / "metrics.jsonl") == [0, 1, 2, 3]
    assert _steps(out / "runs" / "late_s0" / "eval.jsonl") == [1, 3, 4]
    second = run_sweep(parse_manifest(text, output=out))
    assert [(r.plan, r.status) for r in second.records] == [("skip", "completed")] * 3


def _constant_score(self: Any, batch: Any) -> Any:
    import torch

    from rlscope.tasks import Scores

    zeros_BT = torch.zeros(batch.completion_tokens_BT.shape)
    return Scores(rewards_B=torch.zeros(batch.batch_size), token_rewards_BT=zeros_BT)


def test_a_run_out_of_regime_verifies_and_is_skipped(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that stops early by itself (out of regime at step 9 of 30: no group is mixed)
    passes verification with the steps it logged, and is skipped, not re-run; a gap in its
    log is found all the same."""
    from rlscope.tasks.reversal import ReversalTask

    monkeypatch.setattr(ReversalTask, "score", _constant_score)
    text = SMALL.replace("num_steps = 4", "num_steps = 30") + "[runs.d]\nmethod = \"dapo\"\n"
    out = tmp_path / "out"
    first = run_sweep(parse_manifest(text, output=out))
    assert first.records[0].status == "out_of_regime"
    d = out / "runs" / "d_s0"
    assert _steps(d / "metrics.jsonl") == list(range(9))
    assert _steps(d / "eval.jsonl") == [0, 2, 4, 6, 8]
    second = run_sweep(parse_manifest(text, output=out))
    assert (second.records[0].plan, second.records[0].status) == ("skip", "out_of_regime")
    lines = (d / "eval.jsonl").read_text().splitlines(keepends=True)
    (d / "eval.jsonl").write_text("".join(lines[:2] + lines[3:]))
    spec = parse_manifest(text, output=out).runs[0]
    assert verify_run(spec, json.loads((d / "status.json").read_text())) == \
        "eval.jsonl lacks step 4"


def test_incomplete_completed_runs_run_again(tmp_path: Path) -> None:
    """Runs whose status says completed but whose files do not bear it out are re-run, never
    skipped: a missing train step (restarted: the gap lies before the checkpoint), a cut-off
    final evaluation (resumed from the final checkpoint), a step count that disagrees. The
    re-run logs equal the first ones."""
    text = SMALL + "".join(f"[runs.{n}]\nmethod = \"grpo\"\n" for n in ("gap", "cut", "count"))
    out = tmp_path / "out"
    run_sweep(parse_manifest(text, output=out))
    gap, cut, count = (out / "runs" / f"{n}_s0" for n in ("gap", "cut", "count"))
    before = {d: {f: _without_timings(d / f) for f in ("metrics.jsonl", "eval.jsonl")}
              for d in (gap, cut, count)}

    lines = (gap / "metrics.jsonl").read_text().splitlines(keepends=True)
    (gap / "metrics.jsonl").write_text("".join(lines[:1] + lines[2:]))  # step 1 lost
    text_eval = (cut / "eval.jsonl").read_text()
    (cut / "eval.jsonl").write_text(text_eval[:-20])  # the final evaluation cut off
    status = json.loads((count / "status.json").read_text())
    (count / "status.json").write_text(json.dumps({**status, "steps": 2}))

    spec = {s.run: s for s in parse_manifest(text, output=out).runs}
    assert verify_run(spec["gap_s0"], status) == "metrics.jsonl lacks step 1"
    assert verify_run(spec["cut_s0"], status).startswith("eval.jsonl line 3 is not a JSON")
    assert plan_run(spec["gap_s0"]) == (
        "restart", "completed but metrics.jsonl lacks step 1, cannot resume at step 4: "
        "metrics.jsonl lacks step 1")
    assert plan_run(spec["cut_s0"])[0] == "resume"
    assert plan_run(spec["count_s0"]) == (
        "resume", "completed but status.json counts 2 steps, not 4, checkpoint at step 4")

    again = run_sweep(parse_manifest(text, output=out))
    assert [(r.plan, r.status) for r in again.records] == [
        ("restart", "completed"), ("resume", "completed"), ("resume", "completed")]
    for d in (gap, cut, count):
        for f, logged in before[d].items():
            assert _without_timings(d / f) == logged, (d.name, f)
    assert [r.plan for r in run_sweep(parse_manifest(text, output=out)).records] == \
        ["skip"] * 3


def test_a_run_is_completed_only_once_verified(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """train reports completed but a log line went missing (as when something else wrote
    into the directory): the run is recorded failed with what is missing, and the next
    invocation runs it again."""
    from rlscope import train as train_module

    text = SMALL + "[runs.a]\nmethod = \"grpo\"\n"
    out = tmp_path / "out"
    real = train_module.train

    def lossy(cfg: TrainConfig) -> Any:
        result = real(cfg)
        path = Path(cfg.run.runs_dir) / cfg.run.name / "metrics.jsonl"
        path.write_text("".join(path.read_text().splitlines(keepends=True)[:-1]))
        return result

    monkeypatch.setattr(train_module, "train", lossy)
    first = run_sweep(parse_manifest(text, output=out))
    assert first.records[0].status == "failed"
    assert first.records[0].error == "ended completed but metrics.jsonl lacks step 3"
    assert first.failed == [first.records[0]]
    monkeypatch.setattr(train_module, "train", real)
    second = run_sweep(parse_manifest(text, output=out))
    assert (second.records[0].plan, second.records[0].status) == ("restart", "completed")


def test_one_corrupt_run_fails_only_that_run(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Garbage in one run's config.json and binary junk in another's: planning goes on; the
    run that cannot be identified fails with its reason and is left as it was; the run that
    can is run again; the untouched run is skipped; the aggregation leaves the failed run out."""
    text = SMALL + "".join(f"[runs.{n}]\nmethod = \"grpo\"\n" for n in ("bad", "junk", "ok"))
    manifest = tmp_path / "m.toml"
    manifest.write_text(text)
    out = tmp_path / "out"
    assert main(["sweep", str(manifest), "--output", str(out), "--no_report"]) == 0
    bad, junk = out / "runs" / "bad_s0", out / "runs" / "junk_s0"
    (bad / "config.json").write_bytes(b"{\"config\": garbage")
    with (junk / "metrics.jsonl").open("ab") as f:
        f.write(b"\x00\xff\xfe binary junk \x89PNG\n")
    (junk / "status.json").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    capsys.readouterr()

    assert main(["sweep", str(manifest), "--output", str(out), "--no_report"]) == 1
    printed = capsys.readouterr().out
    reason = ("config.json is not valid JSON (Expecting value, line 1): cannot tell what ran "
              f"in {bad}; move or delete it to run this run again")
    assert f"fail     bad_s0 ({reason})" in printed
    assert f"  failed bad_s0: {reason}" in printed
    assert "restart  junk_s0 (status.json is not text, cannot resume at step 4: " \
        "metrics.jsonl line 5 is not a JSON record with a step)" in printed
    assert "skip     ok_s0 (completed)" in printed
    assert "1 completed, 0 out of regime, 1 skipped, 1 failed" in printed
    index = {r["run"]: r for r in json.loads((out / "sweep.json").read_text())["runs"]}
    assert (index["bad_s0"]["plan"], index["bad_s0"]["status"]) == ("fail", "failed")
    assert index["bad_s0"]["error"] == reason
    assert index["junk_s0"]["status"] == "completed"
    assert (bad / "config.json").read_bytes() == b"{\"config\": garbage"  # left as it was
    assert {r.run for r in load_tidy(out)} == {"junk_s0", "ok_s0"}


@pytest.mark.parametrize("name", ["..", ".", "a/b", "/tmp/x", "../../x", "", "a b"])
def test_unsafe_names_are_refused(name: str) -> None:
    assert name_problem(name)
    with pytest.raises(ManifestError) as info:
        parse_manifest(f"[sweep]\nname = {json.dumps(name)}\n" + SMALL
                       + "[runs.a]\nmethod = \"grpo\"\n")
    assert info.value.problems == [f"[sweep] name = {name!r}: {name_problem(name)}"]


def test_unsafe_names_write_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    """`[sweep] name = ".."` (whose default output sweeps/.. is the working directory, where a
    results.csv already lies), `--name ../../x`, an absolute --name and a manifest file whose
    name makes '.' are each refused with one line, and nothing is written."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    (work / "results.csv").write_text("precious\n")
    body = SMALL + "[runs.a]\nmethod = \"grpo\"\n"
    dots = work / "dots.toml"
    dots.write_text("[sweep]\nname = \"..\"\n" + body)
    plain = work / "plain.toml"
    plain.write_text(body)
    stem_dot = work / "..toml"
    stem_dot.write_text(body)
    cases = [
        ([str(dots)], f"error: {dots}: [sweep] name = '..': use letters"),
        ([str(plain), "--name", "../../x"], "error: --name '../../x': use letters"),
        ([str(plain), "--name", str(tmp_path / "abs")], "error: --name '/"),
        ([str(stem_dot)], f"error: {stem_dot}: the manifest's file name gives the sweep "
                          "name '.', which cannot name a folder: set [sweep] name"),
    ]
    for args, start in cases:
        assert main(["sweep", *args]) == 2, args
        err = capsys.readouterr().err
        assert err.startswith(start) and err.count("\n") == 1, err
    assert sorted(p.name for p in work.iterdir()) == ["..toml", "dots.toml", "plain.toml",
                                                      "results.csv"]
    assert (work / "results.csv").read_text() == "precious\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]


def test_a_valid_name_names_the_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    manifest = tmp_path / "m.toml"
    manifest.write_text(SMALL + "[runs.a]\nmethod = \"grpo\"\n")
    assert main(["sweep", str(manifest), "--name", "v2.1", "--dry_run"]) == 0
    assert capsys.readouterr().out.startswith("sweep v2.1: 1 runs (1 ids × 1 seeds) → "
                                              "sweeps/v2.1\n")
