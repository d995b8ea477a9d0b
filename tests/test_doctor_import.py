"""Doctor importers: every format on small inline logs, wrapped verl lines, errors that say
what was expected, and fuzzing (random truncation and garbage never raise)."""

from __future__ import annotations

import json
import random
import zlib
from pathlib import Path

import pytest

from rlscope.doctor.importers import DoctorError, load, sniff
from rlscope.doctor.verl import parse_value

VERL_LINES = [
    "(TaskRunner pid=4242) step:1 - actor/entropy:np.float64(0.61) - actor/pg_loss:-0.02 - "
    "critic/score/mean:np.float64(0.25) - response_length/mean:np.float64(180.0) - "
    "timing_s/gen:np.float64(12.5) - timing_s/step:np.float64(20.0) - training/epoch:np.int32(0)",
    "WARNING: something unrelated happened at 12:00",
    "step:2 - actor/entropy:np.float64(0.55) - actor/pg_loss:np.float64(-0.01) - "
    "critic/score/mean:np.float64(0.30) - response_length/mean:np.float64(190.0) - "
    "timing_s/gen:np.float64(13.0) - timing_s/step:np.float64(21.0) - training/epoch:np.int32(0)",
    "step:3 - val-core/openai/gsm8k/acc/mean@8:np.float64(0.41) - "
    "val-core/openai/gsm8k/acc/best@8/mean:np.float64(0.62)",
]


def _write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def _wrap(line: str, width: int) -> str:
    return "\n".join(line[i:i + width] for i in range(0, len(line), width))


@pytest.mark.parametrize(("text", "value"), [
    ("0.5", 0.5), ("np.float64(0.5)", 0.5), ("np.int32(2)", 2.0), ("-1e-3", -1e-3),
    ("np.float32(nan)", float("nan")), ("True", 1.0), ("tensor(0.25)", 0.25),
    ("tensor(0.25, device='cuda:0')", 0.25), ("np.float64(", None), ("abc", None),
])
def test_verl_values(text: str, value: float | None) -> None:
    got = parse_value(text)
    if value is None:
        assert got is None
    elif value != value:
        assert got is not None and got != got
    else:
        assert got == value


@pytest.mark.parametrize("width", [0, 37, 64, 101])
def test_verl_log_with_wrapped_lines_reads_every_value(tmp_path: Path, width: int) -> None:
    """The same log, unwrapped or wrapped by a terminal at 37, 64 or 101 columns (in the middle
    of keys and numbers), gives the same table."""
    lines = [_wrap(line, width) if width and line.startswith(("(", "step")) else line
             for line in VERL_LINES]
    path = _write(tmp_path, "verl.log", "\n".join(lines) + "\n")
    assert sniff(path) == "verl"
    (table,) = load(path).tables
    entropy = table.first("actor/entropy", "policy/entropy")
    assert entropy is not None
    steps, values = table.series(entropy)
    assert steps.tolist() == [1.0, 2.0] and values.tolist() == [0.61, 0.55]
    length = table.first("length/mean", "response_length/mean")
    assert length is not None and table.values(length).tolist() == [180.0, 190.0]
    val = [n for n in table.names() if n.startswith("val-core/")]
    assert sorted(val) == ["val-core/openai/gsm8k/acc/best@8/mean",
                           "val-core/openai/gsm8k/acc/mean@8"]
    assert table.values("val-core/openai/gsm8k/acc/mean@8").tolist() == [0.41]
    assert table.problems == []


def test_verl_malformed_value_is_reported_with_its_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "verl.log", "noise\nstep:1 - a/b:np.float64(0.5) - c/d:oops\n"
                                        "step:2 - a/b:0.75\n")
    (table,) = load(path).tables
    assert table.values("a/b").tolist() == [0.5, 0.75]
    assert [(p.line, "c/d" in p.message) for p in table.problems] == [(2, True)]


def test_trl_trainer_state(tmp_path: Path) -> None:
    state = {"global_step": 2, "log_history": [
        {"step": 1, "loss": 0.1, "reward": 0.2, "kl": 0.0, "completions/mean_length": 12.0},
        {"step": 2, "loss": 0.05, "reward": 0.4, "kl": 0.01, "completions/mean_length": 14.0},
        {"step": 2, "train_runtime": 3.5, "train_loss": 0.075}]}
    path = _write(tmp_path, "trainer_state.json", json.dumps(state))
    assert sniff(path) == "trl"
    (table,) = load(path).tables
    assert table.fmt == "trl" and table.config["global_step"] == 2
    reward = table.first("reward/mean", "reward")
    assert reward is not None and table.values(reward).tolist() == [0.2, 0.4]
    assert table.values("train_runtime").tolist() == [3.5]


def test_wandb_chart_export_gives_one_table_per_run(tmp_path: Path) -> None:
    text = ("Step,run-a - train/reward,run-a - train/reward__MIN,run-a - train/reward__MAX,"
            "run-b - train/reward\n0,0.1,0.05,0.15,0.2\n1,0.3,0.2,0.4,\n2,,,,0.5\n")
    path = _write(tmp_path, "chart.csv", text)
    assert sniff(path) == "wandb"
    result = load(path)
    tables = {t.source: t for t in result.tables}
    assert set(tables) == {"run-a", "run-b"}
    name_a = tables["run-a"].names()
    assert len(name_a) == 1  # __MIN/__MAX companions are not separate metrics
    assert tables["run-a"].values(name_a[0]).tolist() == [0.1, 0.3]
    assert tables["run-b"].series(tables["run-b"].names()[0])[0].tolist() == [0.0, 2.0]


def test_wandb_history_and_generic_csv(tmp_path: Path) -> None:
    path = _write(tmp_path, "history.csv",
                  "_step,_runtime,train/loss,note\n0,1.0,0.9,a\n1,2.0,0.8,b\n2,3.0,,c\n")
    assert sniff(path) == "wandb"
    (table,) = load(path).tables
    assert table.values("train/loss").tolist() == [0.9, 0.8]
    assert any("note" in p.message for p in table.problems)  # text column reported once
    path = _write(tmp_path, "plain.csv", "iteration,loss\n5,1.0\n6,0.5\n")
    assert sniff(path) == "csv"
    (table,) = load(path).tables
    assert table.series("loss")[0].tolist() == [5.0, 6.0]


def test_jsonl_with_a_bad_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "m.jsonl", '{"step": 1, "x": 1.0}\n{"step": 2, "x": \n'
                                       '{"step": 3, "x": 3.0, "nested": {"y": 2}}\n[1, 2]\n')
    (table,) = load(path).tables
    assert table.series("x")[0].tolist() == [1.0, 3.0]
    assert table.values("nested/y").tolist() == [2.0]
    assert [p.line for p in table.problems] == [2, 4]


@pytest.mark.parametrize(("content", "message"), [
    ("", "is empty"), (b"\x00\x01\x02\xff" * 100, "looks binary"),
    ("just some prose without numbers\n", "could not tell its format"),
])
def test_unusable_files_raise_a_clear_error(tmp_path: Path, content: str | bytes,
                                            message: str) -> None:
    path = _write(tmp_path, "f.log", content)
    with pytest.raises(DoctorError, match=message):
        load(path)


def test_missing_path_and_unknown_format(tmp_path: Path) -> None:
    with pytest.raises(DoctorError, match="does not exist"):
        load(tmp_path / "nope.log")
    path = _write(tmp_path, "plain.csv", "step,loss\n1,2\n")
    with pytest.raises(DoctorError, match="--format 'xml' is unknown"):
        load(path, "xml")
    with pytest.raises(DoctorError, match=r"without metrics\.jsonl"):
        load(tmp_path)


def _fuzz_variants(text: str, seed: int, n: int = 60) -> list[bytes]:
    rng = random.Random(seed)
    data = text.encode()
    out = []
    for _ in range(n):
        cut = data[: rng.randrange(1, len(data) + 1)]
        junk = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40)))
        pos = rng.randrange(0, len(cut) + 1)
        out.append(cut[:pos] + junk + cut[pos:])
    return out


@pytest.mark.parametrize(("name", "text"), [
    ("verl.log", "\n".join(VERL_LINES * 3) + "\n"),
    ("chart.csv", "Step,r - m,r - m__MIN,r - m__MAX\n" + "".join(
        f"{i},{i / 10},{i / 20},{i / 5}\n" for i in range(30))),
    ("plain.csv", "step,a,b\n" + "".join(f"{i},{i},{-i}\n" for i in range(30))),
])
def test_fuzzed_logs_never_raise_anything_but_doctor_error(tmp_path: Path, name: str,
                                                           text: str) -> None:
    """Random truncations with random bytes inserted: the importers either read something or
    raise DoctorError with a message; no other exception escapes."""
    read = 0
    for i, variant in enumerate(_fuzz_variants(text, seed=zlib.crc32(name.encode()))):
        path = _write(tmp_path, f"{i}_{name}", variant)
        for fmt in ("auto", name.split(".")[0] if name.startswith("verl") else "csv"):
            try:
                result = load(path, fmt)
            except DoctorError:
                continue
            read += 1
            for table in result.tables:
                for metric in table.names():
                    table.series(metric)
    assert read > 0
